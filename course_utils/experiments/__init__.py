"""The lessons' experiments: functions that produce a lesson's measurements.

Kept apart from the toolkit a learner reuses in their own project (``runtime``, ``data``,
``accumulation``, ``memory``, ``timing``, ``report``), so those modules stay short. One module per
concern, named after the concern (not the lesson number). Each function returns a small, JSON-able
dict, so it can also run in a fresh process with N CPU replicas (``runtime.run_on_cpu_replicas``).
"""
