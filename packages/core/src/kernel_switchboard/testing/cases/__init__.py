"""Conformance case families: ``cases(op, device, size) -> list[Case]`` in each module."""
