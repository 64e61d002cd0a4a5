"""Reading back what torchlens puts into a notebook output: the packed page inside an iframe."""

import base64
import gzip
import html
import json
import re


def unpack_frame(frame):
    """The page in an iframe's srcdoc and the bundle packed into it: (page, {"name", "data", "scripts"})."""
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))
    packed = re.search(r'<script type="application/octet-stream" id="tl-packed">([^<]*)</script>', page).group(1)
    return page, json.loads(gzip.decompress(base64.b64decode(packed)))
