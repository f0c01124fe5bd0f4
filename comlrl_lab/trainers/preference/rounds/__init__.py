"""The round pipeline: collect joint candidates, pair them, label or judge them, replay and select."""
