"""Video reading (decord) and Qwen3-VL patch construction."""
from paravt_jax.video.frames import patchify, patchify_image, smart_resize
from paravt_jax.video.reader import Clip, VideoError, VideoMetadata, VideoReader, read_frames, video_metadata

__all__ = ["Clip", "VideoError", "VideoMetadata", "VideoReader", "read_frames", "video_metadata",
           "patchify", "patchify_image", "smart_resize"]
