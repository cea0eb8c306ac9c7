"""``python -m attn_course.bench`` = ``attn-course bench``."""
import sys

from .cli import main

sys.exit(main())
