"""A small warehouse inventory: items, stock movements and reports."""

from dataclasses import dataclass, field
from datetime import date
from typing import Dict, List, Optional


@dataclass
class Item:
    sku: str
    name: str
    unit_price: float
    quantity: int = 0
    reorder_level: int = 10
    tags: List[str] = field(default_factory=list)

    def value(self) -> float:
        return self.unit_price * self.quantity

    def needs_reorder(self) -> bool:
        return self.quantity <= self.reorder_level


@dataclass
class Movement:
    sku: str
    delta: int
    day: date
    reason: str = ""


class InventoryError(Exception):
    pass


class Inventory:
    def __init__(self) -> None:
        self.items: Dict[str, Item] = {}
        self.movements: List[Movement] = []

    def add_item(self, item: Item) -> None:
        if item.sku in self.items:
            raise InventoryError(f"duplicate sku {item.sku}")
        if item.unit_price < 0:
            raise InventoryError(f"negative price for {item.sku}")
        self.items[item.sku] = item

    def remove_item(self, sku: str) -> Item:
        item = self.items.pop(sku, None)
        if item is None:
            raise InventoryError(f"unknown sku {sku}")
        return item

    def get(self, sku: str) -> Optional[Item]:
        return self.items.get(sku)

    def receive(self, sku: str, count: int, day: date, reason: str = "delivery") -> None:
        if count <= 0:
            raise InventoryError("count must be positive")
        item = self._require(sku)
        item.quantity += count
        self.movements.append(Movement(sku, count, day, reason))

    def ship(self, sku: str, count: int, day: date, reason: str = "order") -> None:
        if count <= 0:
            raise InventoryError("count must be positive")
        item = self._require(sku)
        if item.quantity < count:
            raise InventoryError(
                f"only {item.quantity} of {sku} in stock, {count} requested"
            )
        item.quantity -= count
        self.movements.append(Movement(sku, -count, day, reason))

    def adjust(self, sku: str, new_quantity: int, day: date) -> None:
        if new_quantity < 0:
            raise InventoryError("quantity cannot be negative")
        item = self._require(sku)
        delta = new_quantity - item.quantity
        item.quantity = new_quantity
        if delta != 0:
            self.movements.append(Movement(sku, delta, day, "stock count"))

    def _require(self, sku: str) -> Item:
        item = self.items.get(sku)
        if item is None:
            raise InventoryError(f"unknown sku {sku}")
        return item

    def total_value(self) -> float:
        return sum(item.value() for item in self.items.values())

    def low_stock(self) -> List[Item]:
        low = [item for item in self.items.values() if item.needs_reorder()]
        return sorted(low, key=lambda item: item.quantity)

    def by_tag(self, tag: str) -> List[Item]:
        return [item for item in self.items.values() if tag in item.tags]

    def history(self, sku: str, since: Optional[date] = None) -> List[Movement]:
        moves = [m for m in self.movements if m.sku == sku]
        if since is not None:
            moves = [m for m in moves if m.day >= since]
        return moves

    def turnover(self, sku: str, start: date, end: date) -> int:
        shipped = 0
        for m in self.movements:
            if m.sku == sku and m.delta < 0 and start <= m.day <= end:
                shipped += -m.delta
        return shipped


def format_money(amount: float) -> str:
    return f"${amount:,.2f}"


def stock_report(inventory: Inventory) -> str:
    lines = ["SKU        NAME                     QTY      VALUE"]
    for sku in sorted(inventory.items):
        item = inventory.items[sku]
        lines.append(
            f"{item.sku:<10} {item.name:<24} {item.quantity:>5} {format_money(item.value()):>10}"
        )
    lines.append(f"total value: {format_money(inventory.total_value())}")
    return "\n".join(lines)


def reorder_report(inventory: Inventory) -> str:
    items = inventory.low_stock()
    if not items:
        return "nothing to reorder"
    lines = ["reorder:"]
    for item in items:
        missing = item.reorder_level * 2 - item.quantity
        lines.append(f"  {item.sku} {item.name}: order {missing}")
    return "\n".join(lines)


def load_items(rows: List[Dict[str, str]]) -> Inventory:
    inventory = Inventory()
    for row in rows:
        tags = [t.strip() for t in row.get("tags", "").split(",") if t.strip()]
        inventory.add_item(
            Item(
                sku=row["sku"],
                name=row["name"],
                unit_price=float(row["unit_price"]),
                quantity=int(row.get("quantity", "0")),
                reorder_level=int(row.get("reorder_level", "10")),
                tags=tags,
            )
        )
    return inventory
