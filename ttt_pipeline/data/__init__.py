"""Review data: sources (local, gdown, hub), format readers, label mapping and seeded splits."""
