;; custom_backward.wat: y = x·w (w: float32[2], ones) with a hand-written
;; moe_backward whose input gradient is deliberately not the autograd one:
;; grad_x = grad_y·w + 1, grad_w = Σ_batch grad_y·x. The host tests use it
;; to check that a module's own backward replaces the tape.
(module
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "param_new" (func $param_new (param i32 i32 i32 i32 i32 i32 f64 f64) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "grad_output" (func $grad_output (param i32) (result i32)))
  (import "moehost_v1" "grad_input" (func $grad_input (param i32 i32) (result i32)))
  (import "moehost_v1" "param_grad" (func $param_grad (param i32 i32) (result i32)))
  (import "moehost_v1" "op" (func $op (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0 "x", 8 "y", 12 "w", 16 shape [-1 2], 32 shape [2],
  ;; 64 args, 128 attrs: [1.0], 136 attrs: [0.0 0.0].
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 12) "w")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\02\00\00\00\00\00\00\00")
  (data (i32.const 32) "\02\00\00\00\00\00\00\00")
  (data (i32.const 128) "\00\00\00\00\00\00\f0\3f")
  (global $w (mut i32) (i32.const 0))

  (func (export "moe_abi_version") (result i32) (i32.const 1))

  (func (export "moe_init") (result i32)
    (drop (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (drop (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (global.set $w (call $param_new (i32.const 12) (i32.const 1) (i32.const 1) (i32.const 32) (i32.const 1)
      (i32.const 2) (f64.const 0) (f64.const 0)))
    (i32.const 0))

  ;; $mul returns a·b (op 7).
  (func $mul (param $a i32) (param $b i32) (result i32)
    (i32.store (i32.const 64) (local.get $a))
    (i32.store (i32.const 68) (local.get $b))
    (call $op (i32.const 7) (i32.const 64) (i32.const 2) (i32.const 0) (i32.const 0)))

  (func (export "moe_forward") (result i32)
    (call $output (i32.const 0) (call $mul (call $input (i32.const 0)) (global.get $w))))

  (func (export "moe_backward") (result i32)
    (local $gy i32) (local $gx i32) (local $gw i32) (local $r i32)
    (local.set $gy (call $grad_output (i32.const 0)))
    ;; grad_x = add_scalar(grad_y·w, 1) (op 10).
    (i32.store (i32.const 64) (call $mul (local.get $gy) (global.get $w)))
    (local.set $gx (call $op (i32.const 10) (i32.const 64) (i32.const 1) (i32.const 128) (i32.const 1)))
    ;; grad_w = sum(grad_y·x, axis 0) (op 29).
    (i32.store (i32.const 64) (call $mul (local.get $gy) (call $input (i32.const 0))))
    (local.set $gw (call $op (i32.const 29) (i32.const 64) (i32.const 1) (i32.const 136) (i32.const 2)))
    (local.set $r (call $param_grad (global.get $w) (local.get $gw)))
    (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
    (call $grad_input (i32.const 0) (local.get $gx)))
)
