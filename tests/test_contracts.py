"""Data contracts: the rules planes enforce, their validation, and their dict/YAML/JSON forms."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit.contracts import (
    BoundedStaleness,
    Contract,
    ContractError,
    DataContract,
    OnPolicy,
    Replay,
    contract_from_dict,
)
from conduit.errors import ConduitError, UnknownNameError

# --- the sample rules ---------------------------------------------------------------------------


@given(st.integers(-50, 50), st.integers(-50, 50))
def test_on_policy_admits_only_its_own_version(version, update):
    c = OnPolicy()
    assert c.admits(version, update) is (version == update)
    assert c.min_version(update) == update


@given(st.integers(0, 5), st.integers(-50, 50), st.integers(-50, 50))
def test_bounded_staleness_admits_versions_within_lag(max_lag, version, update):
    c = BoundedStaleness(max_lag=max_lag, max_reuse=2)
    assert c.admits(version, update) is (update - version <= max_lag)
    assert c.admits(c.min_version(update), update)
    assert not c.admits(c.min_version(update) - 1, update)


def test_newer_versions_are_not_stale_under_bounded_staleness():
    assert BoundedStaleness(max_lag=0).admits(7, 5)


def test_reuse_budgets():
    assert OnPolicy().max_uses == 1
    assert [OnPolicy().deliveries_allowed(u) for u in (0, 1, 2)] == [1, 0, 0]
    bs = BoundedStaleness(max_lag=1, max_reuse=3)
    assert bs.max_uses == 3
    assert [bs.deliveries_allowed(u) for u in (0, 2, 3, 9)] == [3, 1, 0, 0]
    rp = Replay(capacity=100, replay_ratio=1.0, min_size=10)
    assert rp.max_uses is None
    assert rp.deliveries_allowed(10**6) is None


def test_obligations_and_repeat_rules():
    assert OnPolicy().must_deliver and not OnPolicy().repeats_in_delivery
    bs = BoundedStaleness(max_lag=1)
    assert bs.must_deliver and not bs.repeats_in_delivery
    rp = Replay(capacity=100, replay_ratio=1.0, min_size=10)
    assert not rp.must_deliver and rp.repeats_in_delivery
    assert rp.admits(-100, 100) and rp.min_version(5) is None


def test_contracts_without_rate_limit_always_allow():
    for c in (OnPolicy(), BoundedStaleness(max_lag=2)):
        assert c.can_insert(10**9, 0, 10**9)
        assert c.can_sample(10**9, 0, 0)


def test_every_contract_satisfies_the_protocol():
    contracts: list[Contract] = [
        OnPolicy(),
        BoundedStaleness(max_lag=1),
        Replay(capacity=10, replay_ratio=1.0, min_size=1),
    ]
    for c in contracts:
        assert isinstance(c, DataContract)
        assert isinstance(c, OnPolicy | BoundedStaleness | Replay)


def test_contracts_are_frozen_and_hashable():
    bs = BoundedStaleness(max_lag=1, max_reuse=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        bs.max_lag = 3  # type: ignore[misc]
    assert hash(bs) == hash(BoundedStaleness(max_lag=1, max_reuse=2))
    assert OnPolicy() == OnPolicy()


# --- the Replay rate limiter ---------------------------------------------------------------------


def test_replay_default_error_buffer():
    assert Replay(capacity=1000, replay_ratio=0.5, min_size=100).tolerance == 100
    assert Replay(capacity=1000, replay_ratio=4.0, min_size=100).tolerance == 400
    assert Replay(capacity=1000, replay_ratio=2.0, min_size=0).tolerance == 2
    assert Replay(capacity=1000, replay_ratio=2.0, min_size=50, error_buffer=7).tolerance == 7


def test_replay_band_is_reverbs_sample_to_insert_rule():
    rp = Replay(capacity=10_000, replay_ratio=2.0, min_size=100, error_buffer=10)
    assert rp.rate_error(150, 90) == 2.0 * 50 - 90
    assert rp.in_band(150, 90)  # error +10
    assert rp.in_band(150, 110)  # error -10
    assert not rp.in_band(150, 89)  # error +11: under-sampled
    assert not rp.in_band(150, 111)  # error -11: over-sampled
    # warm-up: inserts are free, samples are refused
    assert rp.can_insert(99, 0, 0) and rp.can_insert(100, 0, 0)
    assert not rp.can_sample(1, 99, 0)
    assert rp.in_band(99, 0) and not rp.in_band(99, 1)
    # after warm-up: inserting pushes the error up, sampling down
    assert rp.can_insert(5, 100, 0) and not rp.can_insert(6, 100, 0)
    assert rp.can_sample(10, 100, 0) and not rp.can_sample(11, 100, 0)


@given(
    ratio=st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 8.0]),
    min_size=st.integers(1, 64),
    extra=st.floats(0.0, 3.0),
    inserted=st.integers(0, 500),
    sampled=st.integers(0, 500),
)
def test_allowed_amounts_match_the_predicates(ratio, min_size, extra, inserted, sampled):
    rp = Replay(
        capacity=1000,
        replay_ratio=ratio,
        min_size=min_size,
        error_buffer=max(1.0, ratio) * (1 + extra),
    )
    n = rp.samples_allowed(inserted, sampled)
    if n:
        assert rp.can_sample(n, inserted, sampled)
    assert not rp.can_sample(n + 1, inserted, sampled)
    m = rp.inserts_allowed(inserted, sampled)
    if m:
        assert rp.can_insert(m, inserted, sampled)
    assert not rp.can_insert(m + 1, inserted, sampled)


@st.composite
def _limiter_walk(draw):
    ratio = draw(st.sampled_from([0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 4.0, 7.0]))
    min_size = draw(st.integers(1, 80))
    capacity = draw(st.integers(min_size, 4 * min_size))
    ops = draw(
        st.lists(st.tuples(st.booleans(), st.integers(1, min_size)), min_size=1, max_size=80)
    )
    return Replay(capacity=capacity, replay_ratio=ratio, min_size=min_size), ops


@settings(max_examples=200)
@given(_limiter_walk())
def test_a_plane_that_asks_the_limiter_never_leaves_the_band_nor_deadlocks(walk):
    """With the default error_buffer, chunks and batches up to min_size steps always progress."""
    rp, ops = walk
    inserted = sampled = 0
    for want_insert, n in ops:
        can_i = rp.can_insert(n, inserted, sampled)
        can_s = rp.can_sample(n, inserted, sampled)
        assert can_i or can_s, (inserted, sampled, n)  # no deadlock
        if (want_insert and can_i) or not can_s:
            inserted += n
        else:
            sampled += n
        assert rp.in_band(inserted, sampled), (inserted, sampled)


# --- validation names the field ----------------------------------------------------------------

_GOOD_REPLAY = {"capacity": 1000, "replay_ratio": 1.0, "min_size": 100}


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: BoundedStaleness(max_lag=-1), "max_lag"),
        (lambda: BoundedStaleness(max_lag=1.5), "max_lag"),
        (lambda: BoundedStaleness(max_lag=True), "max_lag"),
        (lambda: BoundedStaleness(max_lag="2"), "max_lag"),
        (lambda: BoundedStaleness(max_lag=1, max_reuse=0), "max_reuse"),
        (lambda: Replay(**{**_GOOD_REPLAY, "capacity": 0}), "capacity"),
        (lambda: Replay(**{**_GOOD_REPLAY, "capacity": None}), "capacity"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": 0}), "replay_ratio"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": -2.0}), "replay_ratio"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": math.nan}), "replay_ratio"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": math.inf}), "replay_ratio"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": "fast"}), "replay_ratio"),
        (lambda: Replay(**{**_GOOD_REPLAY, "min_size": -1}), "min_size"),
        (lambda: Replay(**{**_GOOD_REPLAY, "min_size": 2000}), "min_size"),
        (lambda: Replay(**{**_GOOD_REPLAY, "sampler": ""}), "sampler"),
        (lambda: Replay(**{**_GOOD_REPLAY, "sampler": 3}), "sampler"),
        (lambda: Replay(**{**_GOOD_REPLAY, "error_buffer": 0.5}), "error_buffer"),
        (lambda: Replay(**{**_GOOD_REPLAY, "replay_ratio": 4, "error_buffer": 3}), "error_buffer"),
        (lambda: Replay(**{**_GOOD_REPLAY, "error_buffer": "wide"}), "error_buffer"),
    ],
)
def test_bad_values_raise_contract_error_naming_the_field(make, field):
    with pytest.raises(ContractError) as info:
        make()
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ConduitError)


def test_integral_floats_and_ints_are_normalised():
    rp = Replay(capacity=1e3, replay_ratio=2, min_size=10.0)
    assert rp.capacity == 1000 and isinstance(rp.capacity, int)
    assert rp.replay_ratio == 2.0 and isinstance(rp.replay_ratio, float)
    assert isinstance(rp.min_size, int)


# --- dict / JSON / YAML round trips -----------------------------------------------------------

contracts = st.one_of(
    st.just(OnPolicy()),
    st.builds(BoundedStaleness, max_lag=st.integers(0, 100), max_reuse=st.integers(1, 100)),
    st.integers(1, 10**7).flatmap(
        lambda cap: st.builds(
            Replay,
            capacity=st.just(cap),
            replay_ratio=st.floats(0.01, 64.0),
            min_size=st.integers(0, cap),
            sampler=st.sampled_from(["uniform", "prioritized", "fifo"]),
            error_buffer=st.one_of(st.none(), st.floats(64.0, 1e6)),
        )
    ),
)


@given(contracts)
def test_dict_round_trip(contract):
    assert contract_from_dict(contract.to_dict()) == contract


@given(contracts)
def test_json_and_yaml_round_trip(contract):
    assert contract_from_dict(json.loads(json.dumps(contract.to_dict()))) == contract
    assert contract_from_dict(yaml.safe_load(yaml.safe_dump(contract.to_dict()))) == contract


def test_from_yaml_text():
    text = """
    kind: replay
    capacity: 1000000
    replay_ratio: 8
    min_size: 1000
    sampler: prioritized
    """
    rp = contract_from_dict(yaml.safe_load(text))
    assert rp == Replay(capacity=1_000_000, replay_ratio=8.0, min_size=1000, sampler="prioritized")


@pytest.mark.parametrize("kind", ["on_policy", "OnPolicy", "on-policy", "ONPOLICY"])
def test_kind_spellings(kind):
    assert contract_from_dict({"kind": kind}) == OnPolicy()


def test_bounded_staleness_defaults_max_reuse_to_one():
    assert contract_from_dict({"kind": "bounded_staleness", "max_lag": 2}).max_reuse == 1


@pytest.mark.parametrize(
    ("d", "field"),
    [
        ({}, "kind"),
        ({"kind": 3}, "kind"),
        ({"kind": "bounded_staleness"}, "max_lag"),
        ({"kind": "bounded_staleness", "max_lag": 1, "max_lagg": 2}, "max_lagg"),
        ({"kind": "replay", "capacity": 10, "min_size": 1}, "replay_ratio"),
        ({"kind": "on_policy", "max_lag": 1}, "max_lag"),
        ({"kind": "replay", "capacity": 10, "replay_ratio": 1, "min_size": 11}, "min_size"),
    ],
)
def test_from_dict_errors_name_the_field(d, field):
    with pytest.raises(ContractError) as info:
        contract_from_dict(d)
    assert info.value.field == field
    assert field in str(info.value)


def test_unknown_kind_lists_the_known_ones():
    with pytest.raises(UnknownNameError) as info:
        contract_from_dict({"kind": "offline"})
    assert isinstance(info.value, ConduitError)
    message = str(info.value)
    assert "offline" in message
    assert "on_policy" in message and "replay" in message and "bounded_staleness" in message


def test_from_dict_rejects_non_mappings():
    with pytest.raises(ContractError):
        contract_from_dict(["replay"])  # type: ignore[arg-type]
