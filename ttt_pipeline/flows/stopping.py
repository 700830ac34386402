"""Give SIGTERM back to the caller's handler while a flow body runs.

Prefect's flow engine installs its own SIGTERM handler for the flow's duration: it marks the run Crashed, then
keeps reporting to a server that a signal sent to the whole process group has often stopped already (measured:
the process lingered for over 40 s printing websocket errors). A caller that handles stopping itself
(`ttt-pipeline run`, ttt_pipeline/cli/stopping.py) registers its handler here, and the flow puts it back as its body starts;
Prefect restores the caller's handler when the flow ends. Without a registered handler nothing changes.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

_handler: list[Callable] = []


def register(handler: Callable | None) -> None:
    """The handler a flow body should run under (None: leave Prefect's)."""
    _handler[:] = [handler] if handler is not None else []


def reclaim() -> None:
    """Called first in a flow body: re-installs the registered handler for SIGTERM (main thread only)."""
    if _handler and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler[0])
