"""Benchmarks for shuffled: `python -m benchmarks [NAMES...] [--quick] [--out DIR]`.

Every scenario runs real daemon processes on loopback and compares itself with a
baseline measured in the same run (a bare uvloop socket pair, or another case of
the same scenario), because absolute numbers on a small, shared machine drift
from run to run while ratios taken minutes apart mostly do not.

This package must stay import-light: helper processes run `python -m
benchmarks.<module>`, which imports this file first.
"""
