//go:build (cudaemu || metalemu) && linux && amd64

// Fiber switching for the emulator (System V AMD64).
//
// hp_emu_swap(void **save_sp, void *load_sp) saves the callee-saved
// registers on the current stack, stores the stack pointer in *save_sp,
// switches to load_sp and restores the registers saved there. A fresh
// fiber's stack holds zeros for the registers, except r12 (the argument)
// and r13 (the entry function), and hp_emu_trampoline as return address.

	.text
	.globl	hp_emu_swap
	.type	hp_emu_swap, @function
hp_emu_swap:
	pushq	%rbp
	pushq	%rbx
	pushq	%r12
	pushq	%r13
	pushq	%r14
	pushq	%r15
	movq	%rsp, (%rdi)
	movq	%rsi, %rsp
	popq	%r15
	popq	%r14
	popq	%r13
	popq	%r12
	popq	%rbx
	popq	%rbp
	ret
	.size	hp_emu_swap, .-hp_emu_swap

	.globl	hp_emu_trampoline
	.type	hp_emu_trampoline, @function
hp_emu_trampoline:
	movq	%r12, %rdi
	andq	$-16, %rsp
	callq	*%r13
	ud2
	.size	hp_emu_trampoline, .-hp_emu_trampoline

	.section	.note.GNU-stack,"",@progbits
