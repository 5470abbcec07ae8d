//! The `CUresult` codes the model returns (their values are `cuda.h`'s),
//! and their names for `cuGetErrorName`.

use std::ffi::{c_int, CStr};

pub(crate) type CuResult = c_int;

pub(crate) const SUCCESS: CuResult = 0;
pub(crate) const INVALID_VALUE: CuResult = 1;
pub(crate) const OUT_OF_MEMORY: CuResult = 2;
pub(crate) const NOT_INITIALIZED: CuResult = 3;
pub(crate) const NO_DEVICE: CuResult = 100;
pub(crate) const INVALID_DEVICE: CuResult = 101;
pub(crate) const INVALID_CONTEXT: CuResult = 201;
pub(crate) const ALREADY_MAPPED: CuResult = 208;
pub(crate) const INVALID_HANDLE: CuResult = 400;
pub(crate) const NOT_FOUND: CuResult = 500;
pub(crate) const ILLEGAL_ADDRESS: CuResult = 700;

const NAMES: [(CuResult, &CStr); 11] = [
    (SUCCESS, c"CUDA_SUCCESS"),
    (INVALID_VALUE, c"CUDA_ERROR_INVALID_VALUE"),
    (OUT_OF_MEMORY, c"CUDA_ERROR_OUT_OF_MEMORY"),
    (NOT_INITIALIZED, c"CUDA_ERROR_NOT_INITIALIZED"),
    (NO_DEVICE, c"CUDA_ERROR_NO_DEVICE"),
    (INVALID_DEVICE, c"CUDA_ERROR_INVALID_DEVICE"),
    (INVALID_CONTEXT, c"CUDA_ERROR_INVALID_CONTEXT"),
    (ALREADY_MAPPED, c"CUDA_ERROR_ALREADY_MAPPED"),
    (INVALID_HANDLE, c"CUDA_ERROR_INVALID_HANDLE"),
    (NOT_FOUND, c"CUDA_ERROR_NOT_FOUND"),
    (ILLEGAL_ADDRESS, c"CUDA_ERROR_ILLEGAL_ADDRESS"),
];

/// The static name of `code`, if the model knows it.
pub(crate) fn c_name(code: CuResult) -> Option<&'static CStr> {
    NAMES.iter().find(|(c, _)| *c == code).map(|(_, n)| *n)
}

/// The name of `code`, for messages.
pub(crate) fn name(code: CuResult) -> String {
    c_name(code).map_or_else(
        || format!("CUDA error {code}"),
        |n| n.to_string_lossy().into_owned(),
    )
}
