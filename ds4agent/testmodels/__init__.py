"""Writers of random-weight DS4 model files (micro ... flash) under the real tensor table."""
