"""Prices (docs/usage.md, Prices): matching a model id to its row and computing a cost.

Rates are USD per million tokens; a cost is integer nano-dollars. A rate with up to six
decimals is an exact integer of pico-dollars per token (1 USD/M = 10⁶ pUSD/token), so
the cost is computed with integers only and rounded once, half up, to nano-dollars.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

DEFAULT_PRICES_FILE = Path(__file__).with_name("default_prices.yaml")
# Costs are integer nano-dollars: this many make one US dollar.
NANO = 1_000_000_000
RATE_KEYS = (
    "input_per_million",
    "output_per_million",
    "cache_read_per_million",
    "cache_write_per_million",
)
CACHE_READ_FACTOR = Decimal("0.1")
CACHE_WRITE_FACTOR = Decimal("1.25")
MAX_RATE = Decimal("100000000")


class PriceFileError(ValueError):
    """The price file is not the documented mapping."""


@dataclass(frozen=True, slots=True)
class Rates:
    """One model's rates in pico-dollars per token."""

    input: int
    output: int
    cache_read: int
    cache_write: int

    @classmethod
    def per_million(
        cls,
        *,
        input: Decimal,  # noqa: A002 - the reference's name
        output: Decimal,
        cache_read: Decimal | None,
        cache_write: Decimal | None,
    ) -> Rates:
        if cache_read is None:
            cache_read = input * CACHE_READ_FACTOR
        if cache_write is None:
            cache_write = input * CACHE_WRITE_FACTOR
        return cls(
            input=_pico(input),
            output=_pico(output),
            cache_read=_pico(cache_read),
            cache_write=_pico(cache_write),
        )

    def cost_nano(
        self, *, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
    ) -> int:
        """(non-cached input × input + cached × read + written × write + output × output),
        in nano-dollars; reasoning tokens are part of the output and not priced again."""
        pico = (
            input_tokens * self.input
            + cache_read * self.cache_read
            + cache_write * self.cache_write
            + output_tokens * self.output
        )
        return (pico + 500) // 1000


def _pico(rate: Decimal) -> int:
    return int((rate * 1_000_000).to_integral_value())


def match(table: Mapping[str, Rates], model: str) -> Rates | None:
    """The rates of ``model``: its own row, else the longest listed prefix of it."""
    found = table.get(model)
    if found is not None:
        return found
    best = ""
    for name in table:
        if len(name) > len(best) and model.startswith(name):
            best = name
    return table[best] if best else None


def read_price_file(path: Path) -> dict[str, dict[str, Decimal | None]]:
    """The YAML price table: ``{model id: {input_per_million, output_per_million,
    cache_read_per_million?, cache_write_per_million?}}``, rates checked."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PriceFileError(f"{path}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PriceFileError(f"{path}: the top level must be a mapping of model ids")
    table: dict[str, dict[str, Decimal | None]] = {}
    for model, entry in data.items():
        if not isinstance(model, str) or not model or len(model) > 256:
            raise PriceFileError(f"{path}: {model!r} is not a model id")
        if not isinstance(entry, dict):
            raise PriceFileError(f"{path}: {model}: expected a mapping of rates")
        unknown = set(entry) - set(RATE_KEYS)
        if unknown:
            raise PriceFileError(f"{path}: {model}: unknown keys {sorted(map(str, unknown))}")
        rates: dict[str, Decimal | None] = {}
        for key in RATE_KEYS:
            required = key in RATE_KEYS[:2]
            if key not in entry or entry[key] is None:
                if required:
                    raise PriceFileError(f"{path}: {model}: {key} is required")
                rates[key] = None
                continue
            rates[key] = _rate(entry[key], where=f"{path}: {model}: {key}")
        table[model] = rates
    return table


def _rate(value: Any, *, where: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PriceFileError(f"{where}: not a number")
    try:
        rate = Decimal(str(value))
    except InvalidOperation as exc:
        raise PriceFileError(f"{where}: not a number") from exc
    if not rate.is_finite() or rate < 0 or rate > MAX_RATE:
        raise PriceFileError(f"{where}: must be between 0 and {MAX_RATE}")
    return rate.quantize(Decimal("0.000001"))


class PriceCache:
    """The price table as this process last read it, read again after ``ttl_s`` or when
    a price changes here (``clear``; other processes see a change within ``ttl_s``)."""

    def __init__(
        self,
        load: Callable[[], dict[str, Rates]],
        *,
        ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._load = load
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._table: dict[str, Rates] | None = None
        self._read_at = 0.0
        # Each model's match in the current table (most calls name a few models).
        self._matches: dict[str, Rates | None] = {}

    def table(self) -> dict[str, Rates]:
        now = self._clock()
        table = self._table
        if table is not None and now - self._read_at < self._ttl_s:
            return table
        with self._lock:
            table = self._load()
            self._table, self._read_at, self._matches = table, now, {}
        return table

    def rates_for(self, model: str) -> Rates | None:
        """``match`` in the current table, remembered until the table is read again."""
        table = self.table()
        matches = self._matches
        if model not in matches:
            matches[model] = match(table, model)
        return matches[model]

    def clear(self) -> None:
        with self._lock:
            self._table = None
