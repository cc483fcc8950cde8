"""What compiled code may call, and the check that it all resolves before the code is loaded.

Object code names the functions it calls by symbol, and MCJIT resolves each one in this
process when the code is linked; a symbol it cannot find becomes a jump to address 0, a
segfault at the first call. LLVM calls such functions on its own: on a CPU without F16C an
f16 conversion is a call to a compiler-rt routine (`__extendhfsf2`, `__truncsfhf2`), and f64
to f16 is one on every x86 CPU (`__truncdfhf2`); the C library that has them (libgcc_s) is
often not loaded into Python. So before any object code is linked, `check` reads the symbols
it leaves undefined and makes sure each one resolves: to one of HELPERS, the functions
graphopt provides itself, or else to a function of this process (the C math library's `exp`
for f64, libc's `memset`). Anything else is a LoweringError naming the symbol and the kernel.
"""
from __future__ import annotations

import functools
import struct

import llvmlite.binding as llvm

from ...errors import LoweringError
from .target import baseline

# The functions graphopt provides itself, as LLVM IR: symbol -> what it computes. Each is
# what compiler-rt's routine of that name computes, with the same calling convention (the
# IR's `half` is passed as LLVM passes it to the routine), written with integer operations
# only where a float one could itself become a call to a routine. Rounding is to nearest
# even, as numpy's astype rounds; a NaN stays a NaN, quiet, its top payload bits kept (what
# F16C's vcvtps2ph does, so every CPU level gives the same bits).
HELPERS = {
    "__extendhfsf2": "f16 -> f32 (exact)",
    "__extendhfdf2": "f16 -> f64 (exact)",
    "__truncsfhf2": "f32 -> f16, rounded to nearest even",
    "__truncdfhf2": "f64 -> f16, rounded once to nearest even (through f32 rounded to odd)",
}

HELPERS_IR = r"""
define float @__extendhfsf2(half %h) {
  %bits = bitcast half %h to i16
  %w = zext i16 %bits to i32
  %sign.h = and i32 %w, 32768
  %sign = shl i32 %sign.h, 16
  %mag = and i32 %w, 32767
  %exp = lshr i32 %mag, 10
  %wide = shl i32 %mag, 13
  ; a normal number: the exponent rebiased from 15 to 127
  %normal = add i32 %wide, 939524096
  ; infinity or NaN: every exponent bit set, the payload kept
  %special = or i32 %wide, 2139095040
  ; zero or subnormal: mag * 2^-24, exact in f32
  %mag.f = uitofp i32 %mag to float
  %tiny.f = fmul float %mag.f, 0x3E70000000000000
  %tiny = bitcast float %tiny.f to i32
  %is.tiny = icmp eq i32 %exp, 0
  %is.special = icmp eq i32 %exp, 31
  %a = select i1 %is.special, i32 %special, i32 %normal
  %b = select i1 %is.tiny, i32 %tiny, i32 %a
  %r = or i32 %b, %sign
  %f = bitcast i32 %r to float
  ret float %f
}

define double @__extendhfdf2(half %h) {
  %f = call float @__extendhfsf2(half %h)
  %d = fpext float %f to double
  ret double %d
}

; f32 -> f16 (after F. Giesen's float_to_half_fast3_rtne): the subnormal results come from
; one f32 addition, whose own rounding to nearest even is the one wanted.
define half @__truncsfhf2(float %f) {
  %u = bitcast float %f to i32
  %sign = and i32 %u, -2147483648
  %a = xor i32 %u, %sign
  ; |f| >= 65536: infinity; NaN stays NaN (quiet)
  %big = icmp uge i32 %a, 1199570944
  %is.nan = icmp ugt i32 %a, 2139095040
  %payload = and i32 %a, 8388607
  %payload.h = lshr i32 %payload, 13
  %nan = or i32 %payload.h, 32256
  %huge = select i1 %is.nan, i32 %nan, i32 31744
  ; |f| < 2^-14: a subnormal f16 or zero
  %small = icmp ult i32 %a, 947912704
  %a.f = bitcast i32 %a to float
  %sum.f = fadd float %a.f, 5.000000e-01
  %sum = bitcast float %sum.f to i32
  %tiny = sub i32 %sum, 1056964608
  ; a normal f16: rebias the exponent, round the 13 dropped bits to nearest even
  %odd.bit = lshr i32 %a, 13
  %odd = and i32 %odd.bit, 1
  %biased = add i32 %a, -939520001
  %rounded = add i32 %biased, %odd
  %normal = lshr i32 %rounded, 13
  %x = select i1 %small, i32 %tiny, i32 %normal
  %y = select i1 %big, i32 %huge, i32 %x
  %sign.h = lshr i32 %sign, 16
  %r = or i32 %y, %sign.h
  %r16 = trunc i32 %r to i16
  %h = bitcast i16 %r16 to half
  ret half %h
}

; f64 -> f16 rounded once: first to f32 rounded to odd (toward zero, the last bit set if
; anything was dropped), which f32's 13 spare bits make exact for the second rounding.
define half @__truncdfhf2(double %d) {
  %t = fptrunc double %d to float
  %back = fpext float %t to double
  %abs.d = call double @llvm.fabs.f64(double %d)
  %abs.back = call double @llvm.fabs.f64(double %back)
  %away = fcmp ogt double %abs.back, %abs.d
  %away.i = zext i1 %away to i32
  %bits = bitcast float %t to i32
  %toward = sub i32 %bits, %away.i
  %inexact = fcmp une double %back, %d
  %sticky = zext i1 %inexact to i32
  %odd = or i32 %toward, %sticky
  %f = bitcast i32 %odd to float
  %h = call half @__truncsfhf2(float %f)
  ret half %h
}

declare double @llvm.fabs.f64(double)
"""


# Symbols the linker (MCJIT's RuntimeDyld) defines itself.
LINKER_SYMBOLS = frozenset({"_GLOBAL_OFFSET_TABLE_"})


def symbols(object_code: bytes) -> tuple[set[str], list[str]]:
    """The symbols an object file (ELF or Mach-O, 64-bit) defines, and those it uses but does
    not define. Anything unreadable is a LoweringError: such code is not loaded."""
    try:
        if object_code[:4] == b"\x7fELF":
            return _elf_symbols(object_code)
        if object_code[:4] in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"):
            return _macho_symbols(object_code)
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
        raise LoweringError(f"object code whose symbol table cannot be read ({e}): it is not "
                            f"loaded") from None
    raise LoweringError(f"object code of an unknown format (starts {object_code[:4]!r}): its "
                        f"symbols cannot be checked, so it is not loaded")


def _elf_symbols(obj: bytes) -> tuple[set[str], list[str]]:
    if obj[4] != 2:
        raise ValueError("32-bit ELF (graphopt reads ELF64)")
    e = "<" if obj[5] == 1 else ">"
    shoff, = struct.unpack_from(e + "Q", obj, 0x28)
    shentsize, shnum = struct.unpack_from(e + "HH", obj, 0x3A)
    # section header: name, type, flags, addr, offset, size, link, info, align, entsize
    headers = [struct.unpack_from(e + "IIQQQQIIQQ", obj, shoff + i * shentsize)
               for i in range(shnum)]
    defined, undefined = set(), []
    for _, kind, _, _, offset, size, link, _, _, entsize in headers:
        if kind != 2:  # SHT_SYMTAB
            continue
        if offset + size > len(obj) or entsize < 24:
            raise ValueError("a symbol table past the end of the file")
        strings = headers[link][4]
        for at in range(offset, offset + size, entsize):
            name, _, _, shndx = struct.unpack_from(e + "IBBH", obj, at)
            if name:
                (undefined.append if shndx == 0 else defined.add)(_cstring(obj, strings + name))
    return defined, undefined


def _macho_symbols(obj: bytes) -> tuple[set[str], list[str]]:
    e = "<" if obj[:4] == b"\xcf\xfa\xed\xfe" else ">"
    ncmds, = struct.unpack_from(e + "I", obj, 16)
    at, defined, undefined = 32, set(), []
    for _ in range(ncmds):
        cmd, size = struct.unpack_from(e + "II", obj, at)
        if cmd == 0x2:  # LC_SYMTAB
            symoff, nsyms, stroff, _ = struct.unpack_from(e + "IIII", obj, at + 8)
            for k in range(nsyms):
                strx, kind = struct.unpack_from(e + "IB", obj, symoff + 16 * k)
                if kind & 0xE0:  # a debugging entry
                    continue
                name = _cstring(obj, stroff + strx).removeprefix("_")
                if kind & 0x0E == 0 and kind & 0x01:  # N_UNDF, N_EXT
                    undefined.append(name)
                elif kind & 0x0E == 0x0E:  # N_SECT
                    defined.add(name)
        at += max(size, 8)
    return defined, undefined


def _cstring(data: bytes, at: int) -> str:
    return data[at:data.index(b"\0", at)].decode()


def check(object_code: bytes, names: tuple[str, ...]) -> None:
    """Make sure the object code defines the functions `names` (the first names the kernel)
    and that every symbol it calls resolves in this process (graphopt's HELPERS are
    registered first, when the code needs one); LoweringError otherwise, before anything
    was linked."""
    _search_the_process()
    defined, undefined = symbols(object_code)
    missing = [n for n in names if n not in defined]
    if missing:
        raise LoweringError(f"object code meant for {names[0]} does not define "
                            f"{', '.join(missing)}: it is not loaded")
    for symbol in undefined:
        if symbol in LINKER_SYMBOLS:
            continue
        if symbol in HELPERS:
            _register_helpers()
        elif not llvm.address_of_symbol(symbol):
            raise LoweringError(f"kernel {names[0]}: its object code calls {symbol}, which "
                                f"neither graphopt's helpers nor this process provide; it "
                                f"was not loaded")


@functools.cache
def _search_the_process() -> llvm.ExecutionEngine:
    """Make the process's own symbols (libc, libm) visible to `address_of_symbol`, as the
    linker sees them: LLVM adds them to its search when the first MCJIT engine is made, so
    one is made here, empty, and kept."""
    return llvm.create_mcjit_compiler(llvm.parse_assembly(""), baseline().machine())


@functools.cache
def _register_helpers() -> None:
    """Compile HELPERS_IR (once per process) and make its functions what every kernel's calls
    to those symbols resolve to: registered symbols win over the process's libraries, so the
    same code runs whether or not libgcc_s happens to be loaded."""
    from .engine import runtime_functions  # the engine loads through this module's check
    for name, address in zip(HELPERS, runtime_functions(HELPERS_IR, tuple(HELPERS))):
        llvm.add_symbol(name, address)
