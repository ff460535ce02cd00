#!/usr/bin/env python3
"""Print the bytes of an image's layers in buildah's store: ``layer-bytes.py GRAPHROOT ID``.

Walks the image's top layer up through its parents in the overlay driver's
layers.json, adding each layer's uncompressed ``diff-size``: the base's bytes
subtracted from the image's are what the Dockerfile's own layers add.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def image_bytes(graphroot: Path, image_id: str) -> int:
    images = json.loads((graphroot / "overlay-images" / "images.json").read_text())
    layers = {
        layer["id"]: layer
        for layer in json.loads((graphroot / "overlay-layers" / "layers.json").read_text())
    }
    (image,) = [i for i in images if i["id"].startswith(image_id)]
    total, layer_id = 0, image.get("layer")
    while layer_id:
        layer = layers[layer_id]
        total += int(layer.get("diff-size", 0))
        layer_id = layer.get("parent")
    return total


if __name__ == "__main__":
    print(image_bytes(Path(sys.argv[1]), sys.argv[2]))
