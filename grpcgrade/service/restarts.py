"""When a face that died is started again: the Python face processes (`faces`) and the native gRPC face
(`native_face`) keep the same rule."""

from __future__ import annotations

import time

#: How long a face may take to start (a Python face process imports the graders and reads the configuration).
START_SECONDS = 120.0
#: The pause before a dead face is started again, doubled while they keep dying within `STABLE_SECONDS`
#: of their start, up to the maximum.
RESTART_PAUSE_SECONDS = 0.2
MAX_RESTART_PAUSE_SECONDS = 10.0
STABLE_SECONDS = 30.0


class Restarts:
    """One face slot's restart pause: short after a face that ran a while, doubling while they die fast."""

    def __init__(self) -> None:
        self.pause_now = RESTART_PAUSE_SECONDS
        self.at = 0.0
        #: Faces started again in this slot.
        self.count = 0

    def started(self) -> None:
        self.at = time.monotonic()

    def pause(self) -> float:
        """The pause before the next start, the face in this slot having just ended."""
        quick = time.monotonic() - self.at < STABLE_SECONDS
        pause = self.pause_now if quick else RESTART_PAUSE_SECONDS
        self.pause_now = min(pause * 2, MAX_RESTART_PAUSE_SECONDS)
        return pause
