"""The API manager (issue 37): provider calls over HTTP under the core's quotas, coalescing keys
and the answer cache (`manager.py`), the providers' service config (`config.py`)."""

from .config import ProviderConfig, ProviderConfigError, parse_providers
from .manager import ApiManager, RequestError, TtlCache, normalize, request_key

__all__ = ["ApiManager", "ProviderConfig", "ProviderConfigError", "RequestError", "TtlCache",
           "normalize", "parse_providers", "request_key"]
