"""A run stops when asked: Ctrl-C or SIGTERM ends `ttt-pipeline run` within seconds, with one line that says what
the store keeps and how to resume.

Why we handle it instead of Prefect: its engine turns SIGTERM into a Crashed flow run and then keeps reporting to
its temporary server, which the same Ctrl-C (sent to the whole process group) has already stopped; the process
then stayed alive for over 40 s printing websocket errors. Everything a run writes is atomic (store entries,
fine-tuning checkpoints, MLflow's database), so ending the process at once loses nothing a re-run does not
redo: the same command resumes from the stored steps and the last checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

GRACE_S = 4.0  # what the last words may take (store look-up, MLflow runs marked KILLED, Prefect's server)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _kept_line(cfg) -> str:
    from ttt_pipeline import steps
    from ttt_pipeline.storage import StepStore

    kept = steps.kept(cfg, StepStore(cfg.store))
    return f"the store ({cfg.store}) keeps {', '.join(kept)}" if kept else f"nothing was stored yet ({cfg.store})"


def _last_words(cfg, out: dict) -> None:
    """Runs in a thread with a deadline: each part is best effort, and the line is printed either way."""
    try:
        out["kept"] = _kept_line(cfg)
    except Exception:  # noqa: BLE001 - a failed look-up must not keep the process alive
        out["kept"] = f"finished steps are kept in the store ({cfg.store})"
    try:
        from ttt_pipeline.io.tracking import end_open_runs

        end_open_runs("KILLED")
        from prefect.server.api.server import SubprocessASGIServer

        for server in list(SubprocessASGIServer._instances.values()):  # the temporary server of this process
            if server.server_process is not None:
                server.server_process.terminate()
    except Exception:  # noqa: BLE001
        pass


class StopOnSignal:
    """`with StopOnSignal(cfg): ...` installs the handlers for the run and restores the previous ones after."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.stopping = False
        self._previous: dict = {}

    def __enter__(self) -> "StopOnSignal":
        from ttt_pipeline.flows import stopping

        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
            stopping.register(self._handle)  # the flow body takes SIGTERM back from Prefect's engine
        return self

    def __exit__(self, *exc) -> None:
        from ttt_pipeline.flows import stopping

        stopping.register(None)
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame) -> None:
        code = 128 + signum  # the shell's convention: 130 after Ctrl-C, 143 after SIGTERM
        if self.stopping:  # a second Ctrl-C: no last words
            os._exit(code)
        self.stopping = True
        out: dict = {}
        worker = threading.Thread(target=_last_words, args=(self.cfg, out), daemon=True)
        worker.start()
        worker.join(GRACE_S)
        kept = out.get("kept", f"finished steps are kept in the store ({Path(self.cfg.store)})")
        print(f"\nstopped ({signal.Signals(signum).name}): {kept}; run the same command again to resume",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(code)  # not sys.exit: Prefect's engine would catch it and keep talking to a stopped server
