"""Suites at scale: one optimize run (or one verification) per task, metrics and reports."""
