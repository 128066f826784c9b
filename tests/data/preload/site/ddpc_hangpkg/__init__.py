"""A package whose import takes far longer than any preload deadline a test gives."""

import time

time.sleep(30)
