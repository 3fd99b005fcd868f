/* xxh_dispatch: XXH3 at the widest vector unit the CPU has.
 *
 * Debian's libxxhash is built for baseline x86-64 (SSE2), but it also exports
 * runtime-dispatched entry points (AVX2, AVX-512) declared in
 * <xxh_x86dispatch.h>, which redefines XXH3_64bits, XXH3_64bits_withSeed and
 * XXH3_64bits_update to them. The hashes are identical; on the development VM
 * a 256 KiB cache-resident piece hashes at ~46 GB/s instead of ~20 GB/s. Every
 * file that hashes bulk bytes includes this header instead of <xxhash.h>.
 * K3_XXH_DISPATCH is set by CMake when the library has the symbols. */
#ifndef K3_XXH_DISPATCH_H
#define K3_XXH_DISPATCH_H

#include <xxhash.h>
#if defined(K3_XXH_DISPATCH) && K3_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif
