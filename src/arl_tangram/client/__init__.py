"""The client SDK: `Client` (blocking) and `AsyncClient`, over HTTP or embedded in-process."""

from ._async import ApiError, AsyncClient, AsyncSession
from ._sync import Client, Session

__all__ = ["ApiError", "AsyncClient", "AsyncSession", "Client", "Session"]
