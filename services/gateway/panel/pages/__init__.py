"""The panel's pages: each module here has ``NAV`` (its entry in the navigation, a ``nav.NavItem``, or None)
and ``register(router)`` (its routes). A new page is one module plus one line in ``PAGES`` (docs/panel.md)."""

from __future__ import annotations

from ..nav import NavItem


def pages() -> list:
    # One line per page; the order of the navigation is NavItem.order.
    from . import account, job, jobs
    from . import audit, dead_letters, executors, nodes, policy, status  # the operations pages
    from . import usage  # tenancy's usage report (issue 14)
    from . import me, oidc  # identity (issue 30): sign-in through a provider, one's roles and tokens
    return [account, jobs, job, executors, nodes, status, dead_letters, policy, audit, usage, oidc, me]


def navigation() -> list[NavItem]:
    items = [page.NAV for page in pages() if getattr(page, "NAV", None) is not None]
    return sorted(items, key=lambda item: (item.order, item.href))
