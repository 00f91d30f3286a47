"""Hand-built LLVM IR kernels for the runtime tests and the launch benchmark (no codegen needed)."""
from __future__ import annotations

from llvmlite import ir

F32, I32 = ir.FloatType(), ir.IntType(32)
GLOBAL_PTR = ir.PointerType(addrspace=1)


def _kernel(module: ir.Module, name: str, params: list[ir.Type]) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), name)
    fn.calling_convention = "ptx_kernel"
    return fn


def _global_index(module: ir.Module, b: ir.IRBuilder) -> ir.Value:
    def sreg(name: str) -> ir.Value:
        full = f"llvm.nvvm.read.ptx.sreg.{name}"
        fn = module.globals.get(full) or ir.Function(module, ir.FunctionType(I32, []), full)
        return b.call(fn, [])
    return b.add(b.mul(sreg("ctaid.x"), sreg("ntid.x")), sreg("tid.x"))


def axpy_ir() -> str:
    """`axpy(x, y, out, alpha: f32, n: i32)`: out[i] = alpha * x[i] + y[i] for i < n (f32)."""
    module = ir.Module("axpy")
    fn = _kernel(module, "axpy", [GLOBAL_PTR, GLOBAL_PTR, GLOBAL_PTR, F32, I32])
    x, y, out, alpha, n = fn.args
    entry, body, done = (fn.append_basic_block(s) for s in ("entry", "body", "done"))
    b = ir.IRBuilder(entry)
    i = _global_index(module, b)
    b.cbranch(b.icmp_signed("<", i, n), body, done)
    b.position_at_end(body)
    xv = b.load(b.gep(x, [i], source_etype=F32), typ=F32)
    yv = b.load(b.gep(y, [i], source_etype=F32), typ=F32)
    b.store(b.fadd(b.fmul(alpha, xv), yv), b.gep(out, [i], source_etype=F32))
    b.branch(done)
    ir.IRBuilder(done).ret_void()
    return str(module)


def empty_ir() -> str:
    """`empty()`: does nothing; for launch overhead."""
    module = ir.Module("empty")
    fn = _kernel(module, "empty", [])
    ir.IRBuilder(fn.append_basic_block("entry")).ret_void()
    return str(module)


# LLVM parameter types and the PTX parameter types they become.
PARAM_TYPES = {"ptr": (GLOBAL_PTR, "u64"), "i8": (ir.IntType(8), "u8"), "i16": (ir.IntType(16), "u16"),
               "i32": (I32, "u32"), "i64": (ir.IntType(64), "u64"), "f32": (F32, "f32"),
               "f64": (ir.DoubleType(), "f64")}


def signature_ir(kinds: list[str]) -> str:
    """An empty kernel `sig` taking parameters of the given kinds (keys of PARAM_TYPES); a
    kernel's parameter list survives optimisation even where the body ignores it."""
    module = ir.Module("sig")
    fn = _kernel(module, "sig", [PARAM_TYPES[k][0] for k in kinds])
    ir.IRBuilder(fn.append_basic_block("entry")).ret_void()
    return str(module)
