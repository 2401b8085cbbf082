# bash completion for ctxgen:  source apps/ctxgen/completion.bash
# Commands and options come from the ctxgen being completed (`ctxgen --help`, `ctxgen help CMD`),
# so they are never out of date; anything else completes as a file name.
_ctxgen_commands() {  # the names under "Subcommands:" in `ctxgen --help`
  "$1" --help 2>/dev/null | sed -n '/^Subcommands:/,$ s/^  \([a-z][a-z-]*\) .*/\1/p'
}

_ctxgen_options() {  # every -x / --name in the help of ctxgen ($2 empty) or of command $2
  if [[ -z $2 ]]; then "$1" --help 2>/dev/null; else "$1" help "$2" 2>/dev/null; fi |
    grep -oE -- '(^|[ ,])--?[A-Za-z][A-Za-z-]*' | tr -d ' ,'
}

_ctxgen() {
  local cur=${COMP_WORDS[COMP_CWORD]} prog=${COMP_WORDS[0]/#\~/$HOME} cmd="" w commands
  commands=$(_ctxgen_commands "$prog")
  if [[ -z $commands ]]; then  # ctxgen cannot be run from here: file names at least
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    return
  fi
  for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
    if grep -qxF -- "$w" <<<"$commands"; then cmd=$w; break; fi
  done
  if [[ $cmd == help ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(grep -vxF help <<<"$commands")" -- "$cur")
  elif [[ $cur == -* ]]; then  # the global -v/-q work after a command too
    mapfile -t COMPREPLY < <(compgen -W "$(_ctxgen_options "$prog" "$cmd") -v -q" -- "$cur")
  elif [[ -z $cmd ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
  else
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
  fi
}
complete -o filenames -o bashdefault -o default -F _ctxgen ctxgen
