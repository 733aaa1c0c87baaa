"""Tuning: tasks, measurers, a study's seeds (``seeds``), the tuner's loop and
confirmation (``tuner``), Optuna storages (``storage``), studies shared by workers
(``studies``), worker liveness (``liveness``), workers, and keeping a database current
(carry, remeasure, refine, replay)."""
