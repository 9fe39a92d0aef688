"""Supervised fine-tuning: conversations -> trained-token masks -> (packed) rows -> the SFT job."""
