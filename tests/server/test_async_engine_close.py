"""Stopping the server's driver closes the engine core (the PyTorch engine's worker thread
for adaptive's region refits: `LLMEngine.close`); a core without `close` is fine."""

from llmsched.server.async_engine import AsyncEngine


class _Core:
    closed = 0

    def close(self):
        self.closed += 1


def test_stop_closes_the_core():
    core = _Core()
    engine = AsyncEngine(core, metrics=None)
    engine.stop()
    assert core.closed == 1
    AsyncEngine(object(), metrics=None).stop()  # (the virtual GPU has no close)
