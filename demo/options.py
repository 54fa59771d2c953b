"""How big a story the demo tells: its options, light to import (`delayq demo --help` reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class DemoOptions:
    """How big a story to tell. The defaults take about two minutes on two cores."""

    orders_per_second: float = 20.0
    order_seconds: float = 45.0
    min_delay_s: float = 5.0
    max_delay_s: float = 30.0
    pay_ratio: float = 0.4
    nodes: int = 3
    kill_master: bool = True
    reconcile: bool = True
    # Where node data and reports go.
    out_dir: Path = field(default_factory=lambda: Path.home() / ".local" / "state" / "delayq" / "demo")
    seed: int | None = None
    # The state folder of a running dev stack to use (`delayq dev up --state-dir`); see choose_stack.
    stack_dir: Path | None = None
    # The secured dev stack (SASL_SSL, ACLs, ZooKeeper ACLs), each part running as its own principal.
    secure: bool = False
    # Keep the demo cluster's topics and ZooKeeper folder on the stack afterwards (deleted by default).
    keep: bool = False
    # The nodes serve the web console on their HTTP ports (read-only: its actions stay off).
    console: bool = True

    def __post_init__(self) -> None:
        if self.orders_per_second <= 0 or self.order_seconds <= 0:
            raise ValueError("orders_per_second and order_seconds must be positive")
        if not 0 < self.min_delay_s <= self.max_delay_s:
            raise ValueError("min_delay_s must be positive and at most max_delay_s")
        if not 0 <= self.pay_ratio <= 1:
            raise ValueError("pay_ratio must be between 0 and 1")
        if self.nodes < 1:
            raise ValueError("nodes must be at least 1")
