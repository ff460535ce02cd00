"""uvicorn whose first SIGTERM is the component's to handle (the replica's drain, the
router's closing linger) rather than an immediate graceful exit."""

from __future__ import annotations

import asyncio
import signal
import socket
from types import FrameType

import uvicorn


class SigtermFirstServer(uvicorn.Server):
    """The first SIGTERM runs :meth:`on_sigterm` in the server's loop, which ends the
    server later by setting ``should_exit``; a second SIGTERM, or SIGINT, is
    uvicorn's own handling: exit now."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sigterm_taken = False

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def takes_sigterm(self) -> bool:
        """Whether the first SIGTERM is :meth:`on_sigterm`'s (default: yes). A subclass
        returns False when it has nothing to do first (the router with no linger):
        then that SIGTERM is uvicorn's graceful exit."""
        return True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if (
            sig == signal.SIGTERM
            and not self._sigterm_taken
            and self._loop is not None
            and self.takes_sigterm()
        ):
            self._sigterm_taken = True
            self._loop.call_soon_threadsafe(self.on_sigterm)
            return
        super().handle_exit(sig, frame)

    def on_sigterm(self) -> None:
        raise NotImplementedError
