"""One-off studies: each answers one question once (what repair could win back at best, whether masked TTT can pay
at any MLM-head quality, whether bf16 scoring changes predictions), with its rule fixed before the run. Run as
`python -m bench.studies.<name>`; they reuse the benches' recipes (`bench.defenses`, `bench.common`)."""
