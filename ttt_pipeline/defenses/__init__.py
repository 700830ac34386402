"""Defenses against noisy input: text repairs (in front of the model) and engines (around it).

`registry` maps method names (an engine, a repair, or compositions such as `spell+masked_ttt`) to what runs; each
defense lives in its own module. The registry's tables (`registry.ENGINES`, `registry.REPAIRS`) are the one list
of defenses: `registry.describe()` gives each one's name, kind and summary, and the help texts print it.
"""
