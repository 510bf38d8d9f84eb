"""How a batch's requests reach an engine, and the emulated engine behind it.

The pure core (no I/O, no clock): `RadixCache`, `CostModel` and the discrete-event
`EngineSimulator`, which the experiments drive on a simulated clock.
"""

from server.engine.cost_model import CostModel
from server.engine.radix_cache import RadixCache
from server.engine.simulator import EngineSimulator, RequestOutcome, SimRequest, Step

__all__ = ["CostModel", "EngineSimulator", "RadixCache", "RequestOutcome", "SimRequest", "Step"]
