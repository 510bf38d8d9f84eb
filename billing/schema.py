"""What Alembic needs of billing, and only Alembic: the tables' metadata and an engine.

The migrations (`migrations/env.py`) import this module; the server and the CLI go through
billing's door (`billing/__init__.py`), which exports no SQLAlchemy object.
"""

from inference_auctions.billing.database import create_ledger_engine
from inference_auctions.billing.models import Base

__all__ = ["create_ledger_engine", "metadata"]

# The ledger's tables, for Alembic's autogenerate and drift checks.
metadata = Base.metadata
