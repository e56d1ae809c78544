"""The local retriever (issue 37 item 4): `tangram index build` writes an index (`index.py`);
the GPU manager serves it as a ``similarity`` model with ``options.index``, batched, loaded and
swapped like a reward model (`managers/gpu/scoring.py`)."""
