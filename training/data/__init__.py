"""The data side: chat and pair records, the generator, snapshots, curation."""
