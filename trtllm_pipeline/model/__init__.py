"""The model a build starts from: ``source`` resolves a config's ``model.source`` (hub id, local
directory, ``builtin:<name>``) to an HF model directory, ``builtin`` generates the built-in tiny
model, ``catalog`` holds the shapes of the target models for checks that must work offline."""
