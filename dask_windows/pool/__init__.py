"""The pool order: each decode unit read once per epoch, batches mixed from a pool of resident units.

``plan`` is the pure arithmetic (which units, resident when, which windows each step draws);
``stream`` reads the units into the pool and cuts the steps into batches.
"""
