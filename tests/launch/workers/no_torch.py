"""A script that never imports torch: prints which heavy modules the hook imported anyway."""

import json
import sys

print(json.dumps({name: name in sys.modules for name in ("torch", "torchpace")}
                 | {"chained": getattr(sys.modules.get("chained_marker"), "value", None)}))
