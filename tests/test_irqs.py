"""tuna_lab.machine.irqs against this machine's /proc/interrupts and /proc/irq, read independently here."""

import os

import pytest

from tuna_lab.errors import BindingError, TopologyError
from tuna_lab.machine import irqs


def _independent_totals():
    """Per-CPU totals of /proc/interrupts, parsed here without tuna_lab."""
    with open("/proc/interrupts") as fh:
        lines = fh.read().splitlines()
    cpus = [int(name[3:]) for name in lines[0].split()]
    totals = dict.fromkeys(cpus, 0)
    for line in lines[1:]:
        fields = line.split(":", 1)[1].split()
        if len(fields) >= len(cpus) and all(f.isdigit() for f in fields[:len(cpus)]):
            for cpu, field in zip(cpus, fields):
                totals[cpu] += int(field)
    return totals


def _movable_irq():
    """A numbered IRQ whose affinity this process can rewrite (set to what it already is), or None."""
    for irq in irqs.irq_table():
        current = irqs.irq_affinity(irq.name)
        if current is None:
            continue
        try:
            irqs.set_irq_affinity(irq.name, current)
        except BindingError:
            continue
        return irq.name, current
    return None


def test_counts_match_proc_and_only_grow():
    before = _independent_totals()
    counts = irqs.irq_counts()
    after = _independent_totals()
    assert set(counts) == set(before)
    for cpu, n in counts.items():
        assert before[cpu] <= n <= after[cpu]
    assert sum(counts.values()) > 0     # the timer alone interrupts every online CPU


def test_table_has_numbered_and_per_cpu_lines():
    table = irqs.irq_table()
    names = {irq.name for irq in table}
    assert "LOC" in names or any(name.isdigit() for name in names)
    width = max(irqs.irq_counts()) + 1
    assert all(len(irq.counts) == width for irq in table)
    assert "ERR" not in names and "MIS" not in names    # one total, not per CPU


def test_parse_maps_columns_to_cpu_ids_when_cpus_are_offline():
    text = ("           CPU0       CPU3\n"
            "  0:         10         20   IO-APIC   2-edge      timer\n"
            "LOC:        100        300   Local timer interrupts\n"
            "ERR:          0\n")
    table = irqs.parse_interrupts(text)
    assert table[0] == irqs.Irq("0", (10, 0, 0, 20), "IO-APIC 2-edge timer")
    assert table[1].counts == (100, 0, 0, 300) and table[1].label == "Local timer interrupts"
    assert len(table) == 2
    with pytest.raises(TopologyError, match="names no CPUs"):
        irqs.parse_interrupts("garbage\n 0: 1 2\n")


def test_affinity_reads_proc_irq():
    numbered = [irq.name for irq in irqs.irq_table() if irq.name.isdigit()]
    if not numbered:
        pytest.skip("this machine lists no numbered IRQs")
    name = numbered[0]
    with open(f"/proc/irq/{name}/smp_affinity_list") as fh:
        expected = fh.read().strip()
    got = irqs.irq_affinity(name)
    assert got is not None and min(got) == int(expected.split(",")[0].split("-")[0])
    # Not a number: never a path under /proc/irq.
    assert irqs.irq_affinity("LOC") is None
    assert irqs.irq_affinity("../../etc") is None
    assert irqs.irq_affinity("999999999") is None


def test_set_affinity_refuses_bad_input_with_one_line():
    with pytest.raises(BindingError, match="only a numbered IRQ"):
        irqs.set_irq_affinity("LOC", {0})
    with pytest.raises(BindingError, match="no valid CPUs"):
        irqs.set_irq_affinity("24", set())
    with pytest.raises(BindingError, match="must be integers"):
        irqs.set_irq_affinity("24", ["x"])
    with pytest.raises(BindingError, match="no such IRQ") as info:
        irqs.set_irq_affinity("999999999", {0})
    assert "\n" not in str(info.value)


def test_set_affinity_moves_an_irq_and_back():
    found = _movable_irq()
    if found is None:
        pytest.skip("no IRQ affinity is writable here (not root, or every IRQ is managed)")
    name, original = found
    online = sorted(os.sched_getaffinity(0))
    target = {online[-1]}
    try:
        irqs.set_irq_affinity(name, target)
        with open(f"/proc/irq/{name}/smp_affinity_list") as fh:
            assert fh.read().strip() == str(online[-1])
        assert irqs.irq_affinity(name) == frozenset(target)
    finally:
        irqs.set_irq_affinity(name, original)
    assert irqs.irq_affinity(name) == original
