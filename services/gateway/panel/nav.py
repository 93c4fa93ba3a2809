"""A page's entry in the panel's navigation: the links the layout shows, each to the principals who may use it.

Pages declare their ``NAV`` with this; ``mount`` collects them (pages.navigation) into the app's state, where the
layout reads them (web.context), so the rendering helpers the pages import never import the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..auth import Permission


@dataclass(frozen=True)
class NavItem:
    """A link in the layout's navigation, shown only to principals holding ``permission``."""

    href: str
    label: str  # a catalogue key, e.g. "common.nav_jobs"
    permission: Permission = Permission.READ
    order: int = 100
