"""Imported once by the model processes' fork server (`worker.py`), never by the service: what
every model process needs, so a new process (a fork of the server) starts with it imported.
`import transformers` and its model and tokenizer bases take seconds (9 s on a loaded 2-core
machine); paid here once, not on each load or replacement."""

from __future__ import annotations

import cloudpickle  # noqa: F401  (a model factory arrives pickled)
import torch  # noqa: F401
import transformers
import transformers.modeling_utils
import transformers.tokenization_utils_fast  # noqa: F401
from transformers import (  # noqa: F401
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from . import scoring, worker  # noqa: F401
