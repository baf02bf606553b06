"""Course tooling: release exercises, validate a student's notebook, grade a class.

This package imports the model code; the model code never imports it.
"""
