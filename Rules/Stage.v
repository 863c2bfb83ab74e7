(** * Stages: composition, and replaying a memoized stage.

    A stage relates a logical function [F] to a parallel function [f]: related inputs give
    related outputs (the relation being "the local tensors are the placement of the logical
    tensors").  [stage_compose] chains stages; [stage_iterate] iterates one stage.

    The engine's memoization (orchestrator/tvcert/kernel/memo.py) is a different, syntactic
    claim, proved below as [stage_repeat]: a stage is derived once over *slots* (fresh
    variables standing for its boundary inputs), and a copy of it is the template's
    derivation with the copy's boundary expressions substituted *at the slots*.  What is
    proved:

    - terms are trees of ops over slots ([term]); [subst] replaces slots, nothing else, so an
      internal result that happens to be equal to a boundary expression is never replaced
      (the bug of issue 13, class 4, was a substitution by hash-equality instead);
    - a rule is any function of the op and of what the rule may read about its inputs other
      than their expressions ([P]: in the Python kernel the placement, logical shape and dtype,
      i.e. the canonical form), returning the output's [P] and its expression as a context
      over the op's arguments ([Slot i] = the i-th argument);
    - a stage is a list of ops whose arguments are boundary inputs or earlier results;
      [run] derives it, failing when a reference or a rule fails;
    - [stage_repeat]: running the stage on substituted boundary facts gives exactly the
      substituted facts of the run over the template (same rules, same placements, and the
      expressions are the template's rebuilt over the instance's inputs);
    - [eval_subst]: the value of a substituted term is the value of the template term under
      the values of the substituted expressions, so the facts of the copy hold of the copy's
      inputs whenever the template's hold of arbitrary inputs (each rule being a theorem
      about its op for all logical inputs).

    Not proved here, checked in Python (kernel/memo.py, kernel/rules.py): that the single-op
    rules read nothing of an input expression but its canonical form, apart from whether a
    scalar input is a constant and which one, which substitution at non-constant slots does
    not change (the canonical form records boundary constants, which are kept in the template
    as themselves; [replay] checks the slots are filled with non-constants of the slot's shape
    and dtype, sharing exactly as in the template).  Multi-output ops are modelled as one step
    per output. *)
From mathcomp Require Import ssreflect ssrfun ssrbool eqtype ssrnat seq.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Definition stage_ok {A B a b : Type} (RA : A -> a -> Prop) (RB : B -> b -> Prop)
  (F : A -> B) (f : a -> b) : Prop :=
  forall X x, RA X x -> RB (F X) (f x).

Theorem stage_compose {A B C a b c : Type} (R1 : A -> a -> Prop) (R2 : B -> b -> Prop)
  (R3 : C -> c -> Prop) (F : A -> B) (f : a -> b) (G : B -> C) (g : b -> c) :
  stage_ok R1 R2 F f -> stage_ok R2 R3 G g ->
  stage_ok R1 R3 (fun X => G (F X)) (fun x => g (f x)).
Proof. by move=> h1 h2 X x r; apply: h2; apply: h1. Qed.

(** One stage iterated [n] times is a stage (not what memoization relies on: see [stage_repeat]). *)
Theorem stage_iterate {A a : Type} (R : A -> a -> Prop) (F : A -> A) (f : a -> a) :
  stage_ok R R F f -> forall n, stage_ok R R (iter n F) (iter n f).
Proof. by move=> h; elim=> [//|n IH] X x r /=; apply: h; apply: IH. Qed.

(** ** Terms over slots, substitution at slots *)
Section Terms.
Variable O : Type.

Inductive term := Slot of nat | Node of O & seq term.

Fixpoint term_ind' (Q : term -> Prop) (Hs : forall k, Q (Slot k))
  (Hn : forall o ts, List.Forall Q ts -> Q (Node o ts)) (t : term) {struct t} : Q t :=
  match t with
  | Slot k => Hs k
  | Node o ts => Hn o ts ((fix F (us : seq term) : List.Forall Q us :=
                            match us with
                            | [::] => List.Forall_nil Q
                            | u :: us' => List.Forall_cons u (term_ind' Hs Hn u) (F us')
                            end) ts)
  end.

Fixpoint subst (s : nat -> term) (t : term) : term :=
  match t with Slot k => s k | Node o ts => Node o (map (subst s) ts) end.

(** all slots of [t] are below [n] *)
Fixpoint wf (n : nat) (t : term) : bool :=
  match t with Slot k => k < n | Node _ ts => all (wf n) ts end.

Lemma map_Forall_eq {T U : Type} (f g : T -> U) (ts : seq T) :
  List.Forall (fun x => f x = g x) ts -> map f ts = map g ts.
Proof. by elim=> //= x xs e _ ->; rewrite e. Qed.

Lemma subst_comp (s1 s2 : nat -> term) (t : term) :
  subst s1 (subst s2 t) = subst (fun k => subst s1 (s2 k)) t.
Proof.
elim/term_ind': t => [k //|o ts IH] /=.
by rewrite -map_comp; congr Node; apply: map_Forall_eq.
Qed.

Lemma subst_wf_ext (n : nat) (s1 s2 : nat -> term) (t : term) :
  wf n t -> (forall k, k < n -> s1 k = s2 k) -> subst s1 t = subst s2 t.
Proof.
move=> w e; elim/term_ind': t w => [k /= /e //|o ts IH] /= w.
congr Node; apply: map_Forall_eq.
elim: ts IH w => [//|u us IHus] IH /= /andP[wu wus].
inversion IH as [|? ? hu hus]; subst.
by constructor; [apply: hu | apply: IHus].
Qed.

Variable V : Type.
Variable sem : O -> seq V -> V.

Fixpoint eval (rho : nat -> V) (t : term) : V :=
  match t with Slot k => rho k | Node o ts => sem o (map (eval rho) ts) end.

Lemma eval_subst (s : nat -> term) (rho : nat -> V) (t : term) :
  eval rho (subst s t) = eval (fun k => eval rho (s k)) t.
Proof.
elim/term_ind': t => [k //|o ts IH] /=.
by rewrite -map_comp; congr sem; apply: map_Forall_eq.
Qed.
End Terms.

(** ** Deriving a stage *)
Section Derivation.
Variables (O Op P : Type).
(** [rule op ps]: the output's [P] and its expression as a context over the arguments *)
Variable rule : Op -> seq P -> option (P * term O).

Definition fact := (term O * P)%type.
Definition sfact (s : nat -> term O) (f : fact) : fact := (subst s f.1, f.2).

Inductive ref := Bnd of nat | Res of nat.

Fixpoint onth {T : Type} (xs : seq T) (n : nat) : option T :=
  match xs, n with
  | [::], _ => None
  | x :: _, 0 => Some x
  | _ :: xs', n'.+1 => onth xs' n'
  end.

Lemma onth_map {T U : Type} (g : T -> U) (xs : seq T) (n : nat) :
  onth (map g xs) n = omap g (onth xs n).
Proof. by elim: xs n => [|x xs IH] [|n] //=. Qed.

Definition lookup (bnd done : seq fact) (r : ref) : option fact :=
  match r with Bnd k => onth bnd k | Res j => onth done j end.

Fixpoint lookups (bnd done : seq fact) (rs : seq ref) : option (seq fact) :=
  match rs with
  | [::] => Some [::]
  | r :: rs' =>
      match lookup bnd done r, lookups bnd done rs' with
      | Some f, Some fs => Some (f :: fs)
      | _, _ => None
      end
  end.

Definition args (fs : seq fact) (i : nat) : term O := nth (Slot O i) (map fst fs) i.

Definition step (st : Op * seq ref) (bnd done : seq fact) : option fact :=
  match lookups bnd done st.2 with
  | None => None
  | Some fs =>
      match rule st.1 (map snd fs) with
      | Some (p, c) => if wf (size fs) c then Some (subst (args fs) c, p) else None
      | None => None
      end
  end.

Fixpoint run (sts : seq (Op * seq ref)) (bnd done : seq fact) : option (seq fact) :=
  match sts with
  | [::] => Some done
  | st :: sts' =>
      match step st bnd done with
      | Some f => run sts' bnd (rcons done f)
      | None => None
      end
  end.

Section Subst.
Variable s : nat -> term O.

Lemma lookup_subst bnd done r :
  lookup (map (sfact s) bnd) (map (sfact s) done) r = omap (sfact s) (lookup bnd done r).
Proof. by case: r => n /=; rewrite onth_map. Qed.

Lemma lookups_subst bnd done rs :
  lookups (map (sfact s) bnd) (map (sfact s) done) rs = omap (map (sfact s)) (lookups bnd done rs).
Proof.
elim: rs => [//|r rs IH] /=; rewrite lookup_subst IH.
by case: (lookup bnd done r) => [f|]; case: (lookups bnd done rs).
Qed.

Lemma nth_args_subst (fs : seq fact) (d1 d2 : term O) (i : nat) : i < size fs ->
  nth d1 (map fst (map (sfact s) fs)) i = subst s (nth d2 (map fst fs) i).
Proof. by elim: fs i => [//|f fs IH] [|i] //= lt; apply: IH. Qed.

Lemma step_subst st bnd done :
  step st (map (sfact s) bnd) (map (sfact s) done) = omap (sfact s) (step st bnd done).
Proof.
rewrite /step lookups_subst; case: (lookups bnd done st.2) => [fs|//] /=.
have -> : map snd (map (sfact s) fs) = map snd fs by rewrite -map_comp.
case: (rule st.1 (map snd fs)) => [[p c]|//]; rewrite size_map.
case w: (wf (size fs) c) => //=; rewrite /sfact /= subst_comp.
congr (Some (_, _)); apply: (subst_wf_ext w) => i lt.
by rewrite /args (@nth_args_subst _ _ (Slot O i) _ lt).
Qed.

Lemma run_subst sts bnd done :
  run sts (map (sfact s) bnd) (map (sfact s) done) = omap (map (sfact s)) (run sts bnd done).
Proof.
elim: sts done => [//|st sts IH] done /=; rewrite step_subst.
by case: (step st bnd done) => [f|//] /=; rewrite -map_rcons IH.
Qed.
End Subst.

(** A memoized copy: the instance's boundary facts are the template's slot facts with the
    instance's expressions substituted (same [P]: equal canonical forms); its derivation is the
    template's, substituted.  This is what kernel.memo.replay computes. *)
Theorem stage_repeat (sts : seq (Op * seq ref)) (tmpl inst : seq fact) (s : nat -> term O) :
  inst = map (sfact s) tmpl ->
  run sts inst [::] = omap (map (sfact s)) (run sts tmpl [::]).
Proof. by move=> ->; apply: (run_subst s sts tmpl [::]). Qed.
End Derivation.
