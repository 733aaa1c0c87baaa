"""Tuning: tasks, measurers, the tuner, shared Optuna studies, workers, and keeping a
database current (carry, remeasure, refine, replay)."""
