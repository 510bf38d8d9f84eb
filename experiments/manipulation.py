"""The manipulation study: junk requests, decoys, split and merged accounts, joint shading.

VCG makes a user's true value the best bid for the requests the user wants; this study
measures what a user gains by other means, on two pricing rules (docs/SPEC.md): the paper's
(priority slots = the batch's own size, no fee) and fixed slots (K = the batch-size cap) with a
request fee swept over multiples of one slot's worth of the mean value, mean/(K-1).

Small instances: n = 3 to 12 requests, 2 to 4 users, prompts over a 3-token alphabet (so they
share prefixes), values 1 + Pareto(1.5) or uniform on (0, 2] credits, truthful bids. For every
user as the attacker:

* dilution: 1-4 zero-bid requests with fresh prompts (no prefix shared with anyone);
* decoys: 1-4 zero-bid requests under a prefix of another user's prompt (every such prefix),
  or with fresh prompts; from the attacker's own account or a second one (a zero bid pays no
  VCG charge, so the two give the same outcome; both pay the fee);
* split: the attacker's requests over two accounts, every partition;
* merge (pairs of users): one account for both users' requests;
* joint shading (pairs): both users scale their bids by factors from a grid, the order kept;
* misreports: random bids for one user (truthfulness), and IR: no charge above the bid value
  plus the fees.

A user's utility is the sum of its true values times the priorities it gets, minus its exact
(unrounded) VCG payments and its fees; an attack is profitable when it raises that by more
than 0, exactly. Every profitable case is checked again with the slow oracle
(`server.auction.reference`: its own trie, re-solving per user). A fee f only subtracts f per
added request, so each attack is run once without a fee and its gain read at every fee.

Paper scale: the decoy attack on mixshare-50, trees and chains at n = 64 and 256 (queries dealt
to 8 users), 1-16 decoys under the prefix a competitor shares with others.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from inference_auctions.billing.money import MICROS_PER_CREDIT
from inference_auctions.experiments import workloads
from inference_auctions.server.auction import AuctionRequest, run_auction
from inference_auctions.server.auction.charges import PricingRule
from inference_auctions.server.auction.reference import reference_order, reference_payments

# The fee as a multiple of one slot's worth of the mean value, mean / (K - 1).
FEE_SLOTS = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
RECOMMENDED_FEE_SLOTS = 2.0
MAX_DECOYS = 4
SHADES = (1.0, 0.9, 0.75, 0.5, 0.25)
_FRESH = 10**6  # token ids from here on appear in no instance's prompt


@dataclass(frozen=True, slots=True)
class Instance:
    """A batch with truthful bids (each request's bid is its value)."""

    requests: list[AuctionRequest]
    # The truthful utility of each attacker (its accounts) under each rule, once computed.
    honest: dict[tuple[frozenset[str], PricingRule], Fraction] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def users(self) -> list[str]:
        return sorted({r.user for r in self.requests})


def small_instances(seed: int, count: int) -> list[Instance]:
    """`count` random small batches (half Pareto values, half uniform)."""
    rng = np.random.default_rng(seed)
    instances = []
    for index in range(count):
        n = int(rng.integers(3, 13))
        users = int(rng.integers(2, 5))
        requests = []
        for r in range(n):
            pareto = index % 2 == 0
            value = 1.0 + float(rng.pareto(1.5)) if pareto else float(rng.uniform(0.0, 2.0))
            tokens = [int(t) for t in rng.integers(0, 3, int(rng.integers(1, 5)))]
            owner = f"u{r % users}" if r < users else f"u{int(rng.integers(0, users))}"
            requests.append(
                AuctionRequest(f"r{r}", owner, tokens, max(int(value * MICROS_PER_CREDIT), 1))
            )
        instances.append(Instance(requests))
    return instances


# ---- Utilities -------------------------------------------------------------------------------


def utility(
    requests: Sequence[AuctionRequest],
    values: dict[str, int],
    accounts: set[str],
    rule: PricingRule,
    scale: int,
    *,
    oracle: bool = False,
) -> Fraction:
    """What the owner of `accounts` gets: true values times priorities, minus the accounts'
    exact VCG payments (no fee: fees are added per request by the caller). `values` holds the
    true value of each of the owner's real requests; other requests of the accounts are
    worth 0. A request at position k is worth its value times (S-1-k)/(S-1), S = `scale`, the
    slots of the batch without the attack: on the paper's rule a request added behind
    somebody does not make that somebody's place worth more. With `oracle`, the slow
    reference prices it."""
    slots = scale
    if oracle:
        order_ix = reference_order(requests, [r.bid for r in requests])
        order = [requests[i].rid for i in order_ix]
        payments = reference_payments(requests, rule.slots)
    else:
        outcome = run_auction(requests, rule)
        order = outcome.order
        denominator = rule.denominator(len(requests))
        payments = {user: Fraction(v, denominator) for user, v in outcome.numerators.items()}
    total = Fraction(0)
    for place, rid in enumerate(order):
        if rid in values:
            x = Fraction(1) if slots <= 1 else Fraction(slots - 1 - place, slots - 1)
            total += values[rid] * x
    return total - sum((payments.get(account, Fraction(0)) for account in accounts), Fraction(0))


@dataclass(frozen=True, slots=True)
class Attack:
    """A family's best case for one attacker: the requests it sends, and the accounts."""

    requests: list[AuctionRequest]
    accounts: set[str]
    added: int  # requests added to the batch (each pays the fee)


def gain(instance: Instance, attacker: set[str], attack: Attack, rule: PricingRule) -> Fraction:
    """The attack's exact gain for the owner of `attacker` (its real accounts), fee excluded."""
    values = {r.rid: r.bid for r in instance.requests if r.user in attacker}
    scale = rule.slot_count(len(instance.requests))
    honest = _honest_utility(instance, attacker, rule)
    return utility(attack.requests, values, attack.accounts, rule, scale) - honest


def confirmed(instance: Instance, attacker: set[str], attack: Attack, rule: PricingRule) -> bool:
    """The slow oracle's verdict on a gain the fast path found positive (fee excluded)."""
    values = {r.rid: r.bid for r in instance.requests if r.user in attacker}
    scale = rule.slot_count(len(instance.requests))
    honest = utility(instance.requests, values, attacker, rule, scale, oracle=True)
    return utility(attack.requests, values, attack.accounts, rule, scale, oracle=True) > honest


# ---- The attacks -----------------------------------------------------------------------------


def junk_attacks(instance: Instance, user: str) -> list[Attack]:
    """1-4 zero-bid requests with fresh prompts, from the user's own account."""
    return [
        Attack(
            [
                *instance.requests,
                *(AuctionRequest(f"junk{j}", user, [_FRESH + j], 0) for j in range(m)),
            ],
            {user},
            m,
        )
        for m in range(1, MAX_DECOYS + 1)
    ]


def decoy_attacks(instance: Instance, user: str, second_account: bool) -> list[Attack]:
    """1-4 zero-bid decoys under one prefix of another user's prompt (or fresh prompts)."""
    targets = {(): None} | {
        tuple(int(t) for t in r.tokens[:cut]): None
        for r in instance.requests
        if r.user != user
        for cut in range(1, len(r.tokens) + 1)
    }
    sender = f"{user}+decoys" if second_account else user
    accounts = {user, sender}
    return [
        Attack(
            [
                *instance.requests,
                *(AuctionRequest(f"decoy{j}", sender, [*target, _FRESH + j], 0) for j in range(m)),
            ],
            accounts,
            m,
        )
        for target in targets
        for m in range(1, MAX_DECOYS + 1)
    ]


def split_attacks(instance: Instance, user: str) -> list[Attack]:
    """The user's requests over two accounts: every partition into two non-empty parts."""
    mine = [r.rid for r in instance.requests if r.user == user]
    attacks = []
    for size in range(1, len(mine)):
        for part in itertools.combinations(mine[1:], size):  # mine[0] stays: no mirror twice
            moved = set(part)
            requests = [
                AuctionRequest(r.rid, f"{user}+split", r.tokens, r.bid) if r.rid in moved else r
                for r in instance.requests
            ]
            attacks.append(Attack(requests, {user, f"{user}+split"}, 0))
    return attacks


def merge_attack(instance: Instance, pair: tuple[str, str]) -> Attack:
    """Both users' requests in one account."""
    merged = f"{pair[0]}+{pair[1]}"
    requests = [
        AuctionRequest(r.rid, merged, r.tokens, r.bid) if r.user in pair else r
        for r in instance.requests
    ]
    return Attack(requests, {merged}, 0)


def shading_attacks(instance: Instance, pair: tuple[str, str], rule: PricingRule) -> list[Attack]:
    """Both users scale their bids by a factor from `SHADES`, keeping the batch's order."""
    honest = run_auction(instance.requests, rule).order
    attacks = []
    for first, second in itertools.product(SHADES, repeat=2):
        if first == second == 1.0:
            continue
        factor = {pair[0]: first, pair[1]: second}
        requests = [
            AuctionRequest(r.rid, r.user, r.tokens, int(r.bid * factor[r.user]))
            if r.user in pair
            else r
            for r in instance.requests
        ]
        if run_auction(requests, rule).order == honest:
            attacks.append(Attack(requests, set(pair), 0))
    return attacks


# ---- The study on small instances ------------------------------------------------------------


@dataclass
class FamilyResult:
    """Per attacker (a user, or a pair), the best gain of the family and what it added."""

    name: str
    rule: str
    # Per attacker: (best gain without a fee, its best gain per added request's fee level).
    best: list[list[Fraction]]  # attacker -> best gain at each fee in FEE_SLOTS
    gains_of_utility: list[float]  # best gain / honest utility, over the profitable at fee 0
    oracle_mismatches: int = 0

    def profitable(self, fee_index: int) -> float:
        """The share of attackers with a profitable attack at the fee `FEE_SLOTS[fee_index]`."""
        if not self.best:
            return 0.0
        return sum(1 for gains in self.best if gains[fee_index] > 0) / len(self.best)


def _best_per_fee(
    instance: Instance,
    attacker: set[str],
    attacks: Sequence[Attack],
    rule: PricingRule,
    fee_unit: Fraction,
    slots: int,
    oracle: bool,
) -> tuple[list[Fraction], int]:
    """The best gain over `attacks` at every fee level, and the oracle's disagreements."""
    best = [Fraction(-1)] * len(FEE_SLOTS)
    mismatches = 0
    for attack in attacks:
        free = gain(instance, attacker, attack, rule)
        if oracle and free > 0 and not confirmed(instance, attacker, attack, rule):
            mismatches += 1
        for index, multiple in enumerate(FEE_SLOTS):
            fee = int(fee_unit * Fraction(multiple).limit_denominator(100) / (slots - 1))
            if rule.slots is None:
                fee = 0  # the paper's rule has no fee
            best[index] = max(best[index], free - attack.added * fee)
    return best, mismatches


def _honest_utility(instance: Instance, attacker: set[str], rule: PricingRule) -> Fraction:
    """The attacker's truthful utility, computed once per instance, attacker and rule."""
    key = (frozenset(attacker), rule)
    cached = instance.honest.get(key)
    if cached is None:
        values = {r.rid: r.bid for r in instance.requests if r.user in attacker}
        scale = rule.slot_count(len(instance.requests))
        cached = utility(instance.requests, values, attacker, rule, scale)
        instance.honest[key] = cached
    return cached


def study_small(
    seed: int = 35, count: int = 200, cap: int = 16, *, oracle: bool = True
) -> tuple[list[FamilyResult], dict[str, int]]:
    """Every family on `count` small instances, on the paper's rule and on fixed slots `cap`;
    with `oracle`, every profitable case priced again by the slow oracle.

    Returns the families' results and the truthfulness and IR checks (violations counted)."""
    instances = small_instances(seed, count)
    values = [r.bid for instance in instances for r in instance.requests]
    mean_value = Fraction(sum(values), len(values))
    rules = {"paper": PricingRule(), "fixed": PricingRule(slots=cap)}
    results: list[FamilyResult] = []
    rng = np.random.default_rng(seed + 1)
    checks = {"misreports": 0, "truthfulness violations": 0, "IR violations": 0}

    families: dict[str, Callable[[Instance, str], list[Attack]]] = {
        "dilution (fresh junk)": junk_attacks,
        "decoys, own account": lambda i, u: decoy_attacks(i, u, second_account=False),
        "decoys, second account": lambda i, u: decoy_attacks(i, u, second_account=True),
        "split into two accounts": split_attacks,
    }
    for rule_name, rule in rules.items():
        for family, make in families.items():
            result = FamilyResult(family, rule_name, [], [])
            for instance in instances:
                for user in instance.users:
                    attacks = make(instance, user)
                    if not attacks:
                        continue
                    best, bad = _best_per_fee(
                        instance, {user}, attacks, rule, mean_value, cap, oracle
                    )
                    result.best.append(best)
                    result.oracle_mismatches += bad
                    honest = _honest_utility(instance, {user}, rule)
                    if best[0] > 0 and honest > 0:
                        result.gains_of_utility.append(float(best[0] / honest))
            results.append(result)
        for family in ("merge two users", "joint shading (order kept)"):
            result = FamilyResult(family, rule_name, [], [])
            for instance in instances:
                for pair in itertools.combinations(instance.users, 2):
                    attacks = (
                        [merge_attack(instance, pair)]
                        if family.startswith("merge")
                        else shading_attacks(instance, pair, rule)
                    )
                    if not attacks:
                        continue
                    best, bad = _best_per_fee(
                        instance, set(pair), attacks, rule, mean_value, cap, oracle
                    )
                    result.best.append(best)
                    result.oracle_mismatches += bad
                    honest = _honest_utility(instance, set(pair), rule)
                    if best[0] > 0 and honest > 0:
                        result.gains_of_utility.append(float(best[0] / honest))
            results.append(result)
        _check_truthfulness(instances, rule, rng, checks)
    return results, checks


def _check_truthfulness(
    instances: list[Instance], rule: PricingRule, rng: np.random.Generator, checks: dict[str, int]
) -> None:
    """Random misreports never pay; nobody is charged above the bid value plus the fees."""
    for instance in instances:
        outcome = run_auction(instance.requests, rule)
        scale = outcome.slots
        for user in instance.users:
            values = {r.rid: r.bid for r in instance.requests if r.user == user}
            honest = utility(instance.requests, values, {user}, rule, scale)
            # IR: the exact payment is at most the bid value (utility >= 0), and the charge at
            # most the bid value plus the fees.
            value = sum(
                (r.bid * outcome.priority(r.rid) for r in instance.requests if r.user == user),
                Fraction(0),
            )
            if honest < 0 or outcome.charge(user) > value + outcome.fees[user]:
                checks["IR violations"] += 1
            for _ in range(5):
                lie = [
                    AuctionRequest(r.rid, r.user, r.tokens, int(rng.integers(0, 3 * r.bid + 2)))
                    if r.user == user
                    else r
                    for r in instance.requests
                ]
                checks["misreports"] += 1
                if utility(lie, values, {user}, rule, scale) > honest:
                    checks["truthfulness violations"] += 1


# ---- Paper scale -----------------------------------------------------------------------------


@dataclass
class ScaleResult:
    """The decoy attack at paper scale: per attacker, the best gain and the fee that stops it."""

    workload: str
    n: int
    rule: str
    attackers: int
    profitable: int
    stopping_fees: list[Fraction]  # per profitable attacker, in slots of the mean value
    median_decoys: float


def _paper_workload(name: str, n: int, rng: np.random.Generator) -> workloads.Workload:
    if name == "mixshare-50":
        return workloads.mixshare(50, n, rng)
    if name == "trees-short":
        return workloads.trees("short", n, rng)
    return workloads.chains(n, rng)


def study_scale(
    seed: int = 35,
    sizes: Sequence[int] = (64, 256),
    names: Sequence[str] = ("mixshare-50", "trees-short", "chains"),
    attackers: int = 8,
    targets: int = 8,
) -> list[ScaleResult]:
    """Decoys under competitors' shared prefixes at paper scale, on both rules (K = n + 16)."""
    results = []
    decoy_counts = (1, 2, 4, 8, 16)
    for name in names:
        for n in sizes:
            rng = np.random.default_rng(seed)
            load = _paper_workload(name, n, rng)
            requests = [
                AuctionRequest(f"q{i}", f"u{i % 8}", q.tokens, q.value)
                for i, q in enumerate(load.queries)
            ]
            instance = Instance(requests)
            mean_value = Fraction(sum(q.value for q in load.queries), n)
            slots = n + max(decoy_counts)
            for rule_name, rule in (("paper", PricingRule()), ("fixed", PricingRule(slots=slots))):
                chosen = rng.choice(len(requests), size=attackers, replace=False)
                profitable, fees, counts = 0, [], []
                for index in chosen.tolist():
                    user = requests[index].user
                    others = [r for r in requests if r.user != user]
                    picks = rng.choice(len(others), size=min(targets, len(others)), replace=False)
                    best, best_fee, best_m = Fraction(0), Fraction(0), 0
                    for pick in picks.tolist():
                        target = others[pick]
                        cut = _shared_prefix(target, requests)
                        for m in decoy_counts:
                            decoys = [
                                AuctionRequest(
                                    f"decoy{j}",
                                    user,
                                    [*(int(t) for t in target.tokens[:cut]), 2**40 + j],
                                    0,
                                )
                                for j in range(m)
                            ]
                            attack = Attack([*requests, *decoys], {user}, m)
                            free = gain(instance, {user}, attack, rule)
                            if free > best:
                                best, best_m = free, m
                            if free > 0:
                                best_fee = max(best_fee, free / m * (slots - 1) / mean_value)
                    if best > 0:
                        profitable += 1
                        fees.append(best_fee)
                        counts.append(best_m)
                results.append(
                    ScaleResult(
                        name,
                        n,
                        rule_name,
                        attackers,
                        profitable,
                        fees,
                        statistics.median(counts) if counts else 0.0,
                    )
                )
    return results


def _shared_prefix(target: AuctionRequest, requests: Sequence[AuctionRequest]) -> int:
    """The length of the longest prefix `target` shares with another request (at least 1)."""
    mine = np.asarray(target.tokens)
    best = 1
    for other in requests:
        if other.rid == target.rid:
            continue
        theirs = np.asarray(other.tokens)
        length = min(len(mine), len(theirs))
        if length == 0 or mine[0] != theirs[0]:
            continue
        differ = np.nonzero(mine[:length] != theirs[:length])[0]
        best = max(best, int(differ[0]) if differ.size else length)
    return min(best, max(len(mine) - 1, 1))


# ---- The report ------------------------------------------------------------------------------


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def report_small(results: list[FamilyResult], checks: dict[str, int], cap: int) -> str:
    """The small-instance tables as Markdown."""
    fixed_fees = " | ".join(f"fee {m:g}" for m in FEE_SLOTS)
    lines = [
        f"| attack | attackers | paper rule | fixed K={cap}: {fixed_fees} "
        "| median gain / utility (paper) | oracle disagreements |",
        "|---|---:|---:|" + "---:|" * len(FEE_SLOTS) + "---:|---:|",
    ]
    by_key = {(r.rule, r.name): r for r in results}
    for name in dict.fromkeys(r.name for r in results):
        paper, fixed = by_key[("paper", name)], by_key[("fixed", name)]
        cells = " | ".join(_percent(fixed.profitable(i)) for i in range(len(FEE_SLOTS)))
        median = (
            f"{100 * statistics.median(paper.gains_of_utility):.0f}%"
            if paper.gains_of_utility
            else "-"
        )
        lines.append(
            f"| {name} | {len(paper.best)} | {_percent(paper.profitable(0))} | {cells} "
            f"| {median} | {paper.oracle_mismatches + fixed.oracle_mismatches} |"
        )
    lines.append("")
    lines.append(
        f"Checks on both rules: {checks['misreports']} random misreports, "
        f"{checks['truthfulness violations']} profitable; "
        f"{checks['IR violations']} individual-rationality violations."
    )
    return "\n".join(lines)


def report_scale(results: list[ScaleResult]) -> str:
    """The paper-scale decoy table as Markdown."""
    lines = [
        "| workload | n | rule | attackers | profitable | median decoys "
        "| fee that stops the median profitable attacker (slots of the mean value) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        fee = f"{float(statistics.median(r.stopping_fees)):.2f}" if r.stopping_fees else "-"
        lines.append(
            f"| {r.workload} | {r.n} | {r.rule} | {r.attackers} "
            f"| {_percent(r.profitable / r.attackers)} | {r.median_decoys:g} | {fee} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m inference_auctions.experiments.manipulation`: run the study, print tables."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--cap", type=int, default=16, help="K of the fixed-slots rule")
    parser.add_argument("--scale", action="store_true", help="also the paper-scale decoys")
    parser.add_argument("--attackers", type=int, default=8)
    args = parser.parse_args(argv)
    results, checks = study_small(args.seed, args.instances, args.cap)
    print(report_small(results, checks, args.cap))
    if args.scale:
        print()
        print(report_scale(study_scale(args.seed, attackers=args.attackers)))


if __name__ == "__main__":
    main()
