// CUDA's spelling of what blocks.h needs (see the comment at its top). MLX's generated source
// includes cuda_fp16.h (through its device utilities) before this header.
#define DS4_FN __device__ __forceinline__
#define DS4_GLOBAL
#define DS4_PRIVATE

__device__ __forceinline__ float ds4_half_bits(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
