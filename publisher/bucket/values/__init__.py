"""The bucket's pure values: what goes in and comes out, keys, positions and markers."""
