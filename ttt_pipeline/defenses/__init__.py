"""Defenses against noisy input: text repairs (in front of the model) and engines (around it).

`registry` maps method names (`none`, `masked_ttt`, `tent`, `mask_ensemble`, `spell`, the masked TTT recipes
`masked_ttt_views`, `masked_ttt_sgd`, `masked_ttt_lower_norm`, `masked_ttt_anchored`, `tent_filtered`, and
compositions such as `spell+masked_ttt`) to what runs; each defense lives in its own module.
"""
