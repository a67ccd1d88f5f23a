"""The shape of every part of the application (monitor/app `build` puts them together)."""
from __future__ import annotations


class Component:
    """A part of the application: `start` adds its jobs to the shared scheduler, `stop` releases
    what it holds. Neither may raise past App (failures are logged)."""
    name = "component"

    def start(self, scheduler) -> None:
        pass

    def stop(self) -> None:
        pass
