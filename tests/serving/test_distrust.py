"""The users whose batches wait for their commits: remembered for their window, swept in
amortized constant time."""

from __future__ import annotations

from inference_auctions.server.serving.dispatch_ahead import Distrust


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_user_is_distrusted_for_the_window_only() -> None:
    clock = _Clock()
    distrust = Distrust(seconds=60.0, clock=clock)
    assert distrust.trusted("ada", clock.now)
    distrust.add("ada")
    assert not distrust.trusted("ada", 59.9)
    assert distrust.trusted("ada", 60.0)
    assert distrust.trusted("bob", 0.0)  # nobody else


def test_a_new_refusal_extends_the_window() -> None:
    clock = _Clock()
    distrust = Distrust(seconds=60.0, clock=clock)
    distrust.add("ada")
    clock.now = 50.0
    distrust.add("ada")
    assert not distrust.trusted("ada", 100.0)
    assert distrust.trusted("ada", 110.0)


def test_distrusted_users_are_swept_in_amortized_constant_time() -> None:
    clock = _Clock()
    distrust = Distrust(seconds=60.0, sweep=10_000, clock=clock)
    for i in range(10_000):
        distrust.add(f"old{i}")
    assert distrust.sweep_at == 10_000
    # Expired entries go at the next sweep.
    clock.now = 61.0
    distrust.add("fresh")
    assert len(distrust) == 1
    assert not distrust.trusted("fresh", clock.now)
    # A flood of refusals for distinct users within the window: nobody is forgotten early,
    # and each sweep waits for twice what the last one kept, not for every refusal.
    for i in range(25_000):
        distrust.add(f"user{i}")
    assert len(distrust) == 25_001
    assert all(not distrust.trusted(f"user{i}", clock.now) for i in range(0, 25_000, 997))
    assert distrust.sweep_at == 2 * 20_000
