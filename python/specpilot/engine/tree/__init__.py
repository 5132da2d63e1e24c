"""Tree verification (docs/trees.md): build a draft tree from the drafter's block distributions,
verify it in one target pass, accept the longest target-argmax path, commit it."""
