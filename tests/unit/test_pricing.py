"""Prices (docs/usage.md, Prices): matching, the cost formula, the YAML file."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from usage.pricing import (
    DEFAULT_PRICES_FILE,
    PriceCache,
    PriceFileError,
    Rates,
    match,
    read_price_file,
)


def rates(input_rate: str, output_rate: str, read: str | None = None, write: str | None = None):
    return Rates.per_million(
        input=Decimal(input_rate),
        output=Decimal(output_rate),
        cache_read=Decimal(read) if read is not None else None,
        cache_write=Decimal(write) if write is not None else None,
    )


def test_exact_then_the_longest_prefix() -> None:
    table = {
        "gpt-4o": rates("2.5", "10"),
        "gpt-4o-mini": rates("0.15", "0.6"),
        "gpt": rates("9", "9"),
    }
    assert match(table, "gpt-4o-mini") is table["gpt-4o-mini"]
    assert match(table, "gpt-4o-mini-2024-07-18") is table["gpt-4o-mini"]
    assert match(table, "gpt-4o-2024-08-06") is table["gpt-4o"]
    assert match(table, "gpt-5") is table["gpt"]
    assert match(table, "mock-model") is None
    assert match({}, "gpt-4o") is None


def test_the_cost_of_each_kind_of_token() -> None:
    price = rates("0.15", "0.6", read="0.075", write="0.1875")
    # 1e6 of each: 0.15 + 0.075 + 0.1875 + 0.6 USD = 1.0125 USD.
    million = 1_000_000
    assert (
        price.cost_nano(
            input_tokens=million, output_tokens=million, cache_read=million, cache_write=million
        )
        == 1_012_500_000
    )
    # One output token at 0.6 USD/M is 600 nano-dollars exactly.
    assert price.cost_nano(input_tokens=0, output_tokens=1, cache_read=0, cache_write=0) == 600


def test_cache_rates_default_to_a_tenth_and_five_quarters_of_input() -> None:
    price = rates("2", "8")
    assert (
        price.cost_nano(input_tokens=0, output_tokens=0, cache_read=1000, cache_write=0) == 200_000
    )
    assert (
        price.cost_nano(input_tokens=0, output_tokens=0, cache_read=0, cache_write=1000)
        == 2_500_000
    )


def test_fractions_of_a_nano_dollar_round_half_up_once() -> None:
    price = rates("0.0005", "0")  # 0.5 nano-dollars per token
    assert price.cost_nano(input_tokens=1, output_tokens=0, cache_read=0, cache_write=0) == 1
    assert price.cost_nano(input_tokens=3, output_tokens=0, cache_read=0, cache_write=0) == 2


def test_the_shipped_file_reads_and_prices_common_models() -> None:
    table = read_price_file(DEFAULT_PRICES_FILE)
    assert {"gpt-4o", "gpt-4o-mini", "gpt-4.1", "claude-sonnet-4"} <= set(table)
    assert table["gpt-4o-mini"]["input_per_million"] == Decimal("0.15")
    assert table["gemini-2.5-pro"]["cache_read_per_million"] is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("- gpt\n", "mapping of model ids"),
        ("gpt: 3\n", "expected a mapping"),
        ("gpt: {input_per_million: 1}\n", "output_per_million is required"),
        ("gpt: {input_per_million: -1, output_per_million: 1}\n", "between 0"),
        ("gpt: {input_per_million: abc, output_per_million: 1}\n", "not a number"),
        ("gpt: {input_per_million: 1, output_per_million: 1, per_call: 2}\n", "unknown keys"),
        ("gpt: [\n", "prices.yaml"),
    ],
)
def test_a_bad_file_is_refused_with_the_reason(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(PriceFileError, match=problem):
        read_price_file(path)


def test_the_cache_reads_again_after_its_ttl_or_when_cleared() -> None:
    loads: list[int] = []
    now = [0.0]

    def load() -> dict[str, Rates]:
        loads.append(1)
        return {}

    cache = PriceCache(load, ttl_s=10, clock=lambda: now[0])
    cache.table()
    cache.table()
    assert len(loads) == 1
    now[0] = 11
    cache.table()
    assert len(loads) == 2
    cache.clear()
    cache.table()
    assert len(loads) == 3


def test_the_cache_remembers_each_models_match_until_it_reads_again() -> None:
    tables = [{"gpt-4o": rates("1", "1")}, {"gpt-4o": rates("2", "2")}]
    cache = PriceCache(lambda: tables.pop(0), ttl_s=10, clock=lambda: 0.0)
    first = cache.rates_for("gpt-4o-2024-08-06")
    assert first is not None and first.input == 1_000_000
    assert cache.rates_for("gpt-4o-2024-08-06") is first
    assert cache.rates_for("mock-model") is None
    cache.clear()
    second = cache.rates_for("gpt-4o-2024-08-06")
    assert second is not None and second.input == 2_000_000
