"""The HTTP edge: the FastAPI app and its wire formats (SandboxFusion ``/run_code`` and
``/run_jupyter``, the native ``/v1`` routes, ``/get_reward`` and ``/classify``, ``/metrics``, the
dashboard), the route logic independent of HTTP (`service.Service`, which the client SDK's
embedded mode calls too), auth and body-limit middleware, and the ``/run_code`` fast path.

Runs in: the service process (`tangram serve`), on the event loop that also drives the engine;
`jupyter_driver.py` alone is not imported by it: its source is shipped into a sandbox as an
action's program. May import: `runtime` (the engine, the service config), `core` (actions,
errors, resources) and the web stack (FastAPI, pydantic, uvicorn, prometheus_client); never
`client`, `replay` or `cli` (`make lint`'s layers contract), and no manager directly: nodes are
reached through the engine's executor.
"""
