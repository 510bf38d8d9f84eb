"""What `serve` prints at start: where it serves, and the first commands to try against it.

Every command it suggests works against the server it describes: a bid under `auction`, a
tier under `tiers`, a plain request under `fcfs` (which ignores bids); and the command line
tool is named as this shell can run it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from inference_auctions.billing import format_micros
from inference_auctions.server.settings import ServerSettings, without_password

SCRIPT = "inference-auction"


def command_name() -> str:
    """`inference-auction` as this shell runs it: bare when it is on PATH, else the path of
    the one installed beside this Python (`.venv/bin/inference-auction` from the checkout)."""
    script = Path(sys.prefix) / "bin" / SCRIPT
    if not script.exists():
        return SCRIPT
    found = shutil.which(SCRIPT)
    if found is not None and Path(found).resolve() == script.resolve():
        return SCRIPT
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def first_steps(settings: ServerSettings) -> str:
    """The banner: the server, then a user to create and a request that this server serves."""
    base = f"http://{settings.host}:{settings.port}"
    default_url = ServerSettings.model_fields["database_url"].default
    shown_url = without_password(settings.database_url)
    db = "" if settings.database_url == default_url else f" --database-url '{shown_url}'"
    if shown_url != settings.database_url:
        db += "  (with your password for ***)"
    tool = command_name()
    return f"""
inference-auction serving on {base}  (ledger: {shown_url}, pricing: {settings.pricing})

First steps, in another terminal:
  1. create a user with a budget of 10 credits a day (prints its API key once):
       {tool} users create alice --budget 10 --period day{db}
  2. put that key in KEY (KEY=iak_...) and {_request_step(settings, base)}
  3. see the balance:
       curl -s {base}/v1/ledger/balance -H "Authorization: Bearer $KEY"
  4. watch it in a browser, signed in with that key:
       {base}/dashboard
     (an admin key shows the whole market:
       {tool} users create root --budget 0 --admin{db})
  To see users bid against each other for one batch: {tool} demo
API docs: {base}/docs
The log below shows warnings and errors only (--log-level info for more)
"""


def _request_step(settings: ServerSettings, base: str) -> str:
    """Step 2: a request this server's pricing mode serves, and what its answer says."""
    curl = f'curl -s {base}/generate -H "Authorization: Bearer $KEY"'
    if settings.pricing == "tiers":
        menu = settings.tier_menu()
        tier = menu.tiers[0]  # the dearest: its price shows in the charge
        others = ", ".join(f"{t.name} {format_micros(t.price_micros)}" for t in menu.tiers[1:])
        return f"""send a request in the tier {tier.name}
     ({format_micros(tier.price_micros)} credits a request; {others or "no other tier"};\
 without service_tier: {menu.default.name}):
       {curl} \\
            -d '{{"text": "Hello, tiers!", "service_tier": "{tier.name}"}}'
     its meta_info.auction says its tier (service_tier), its place in its batch
     and what it paid (request_charge_micros): the tier's price; a bid is refused here"""
    if settings.pricing == "fcfs":
        return f"""send a request (no bid: first come, first served):
       {curl} \\
            -d '{{"text": "Hello, first come!"}}'
     its meta_info.auction says its place in its batch and that it paid nothing
     (request_charge_micros 0); a bid is ignored here"""
    return f"""send a request with a bid of 0.05 credits:
       {curl} \\
            -d '{{"text": "Hello, auction!", "bid": "0.05"}}'
     its meta_info.auction says where the auction put it and what it paid
     (request_charge_micros): alone in its batch it delays nobody and pays 0"""
