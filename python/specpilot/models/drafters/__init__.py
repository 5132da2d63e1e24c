"""Drafter kinds beyond DFlash (models/drafter.py): DFlash2, DSpark, PARD. Each module holds the
kind's config parsing, its model and its per-generation drafting session (engine/spec_session.py);
kinds.py detects the kind from config.json, load.py loads and validates any of them."""
