;; picky.wat: an identity expert on x:float32[-1,4] whose behaviour its
;; input data chooses, for the host tests of cancellation and blame:
;; - when any element of the batch is 13, it refuses the batch with `fail`
;;   ("input holds 13") and returns ErrInvalidArgument (-3);
;; - when any element is 66, it traps (unreachable);
;; - otherwise, when the first element n is positive, it runs n relu ops
;;   on x before it answers, and returns the first op error it gets.
;; It reads at most the first 60 KiB of the batch (3840 rows).
(module
  (import "moehost_v1" "declare_input" (func $declare_input (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "declare_output" (func $declare_output (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "input" (func $input (param i32) (result i32)))
  (import "moehost_v1" "output" (func $output (param i32 i32) (result i32)))
  (import "moehost_v1" "tensor_read" (func $tensor_read (param i32 i32 i32) (result i32)))
  (import "moehost_v1" "op" (func $op (param i32 i32 i32 i32 i32) (result i32)))
  (import "moehost_v1" "fail" (func $fail (param i32 i32) (result i32)))
  (memory (export "memory") 2)
  ;; 0: "x", 8: "y", 16: shape [-1, 4] as two i64s, 32: "input holds 13",
  ;; 64: the op's args (one handle), 1024: the batch.
  (data (i32.const 0) "x")
  (data (i32.const 8) "y")
  (data (i32.const 16) "\ff\ff\ff\ff\ff\ff\ff\ff\04\00\00\00\00\00\00\00")
  (data (i32.const 32) "input holds 13")
  (func (export "moe_abi_version") (result i32) (i32.const 1))
  (func (export "moe_init") (result i32)
    (drop (call $declare_input (i32.const 0) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
    (call $declare_output (i32.const 8) (i32.const 1) (i32.const 1) (i32.const 16) (i32.const 2)))
  (func (export "moe_forward") (result i32)
    (local $x i32) (local $n i32) (local $i i32) (local $r i32)
    (local.set $x (call $input (i32.const 0)))
    (local.set $n (call $tensor_read (local.get $x) (i32.const 1024) (i32.const 61440)))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (return (local.get $n))))
    ;; Scan the bytes read for a 13.
    (local.set $i (i32.const 0))
    (block $done
      (loop $scan
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (f32.eq (f32.load (i32.add (i32.const 1024) (local.get $i))) (f32.const 13))
          (then
            (drop (call $fail (i32.const 32) (i32.const 14)))
            (return (i32.const -3))))
        (if (f32.eq (f32.load (i32.add (i32.const 1024) (local.get $i))) (f32.const 66))
          (then (unreachable)))
        (local.set $i (i32.add (local.get $i) (i32.const 4)))
        (br $scan)))
    ;; Run n relu ops.
    (local.set $n (i32.trunc_sat_f32_s (f32.load (i32.const 1024))))
    (i32.store (i32.const 64) (local.get $x))
    (local.set $i (i32.const 0))
    (block $ran
      (loop $ops
        (br_if $ran (i32.ge_s (local.get $i) (local.get $n)))
        (local.set $r (call $op (i32.const 11) (i32.const 64) (i32.const 1) (i32.const 0) (i32.const 0)))
        (if (i32.lt_s (local.get $r) (i32.const 0)) (then (return (local.get $r))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $ops)))
    (call $output (i32.const 0) (local.get $x)))
)
